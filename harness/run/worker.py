"""The worker: runs inside one environment, imports torch once, runs that environment's cells.

Invoked by the runner as ``python -m harness.run.worker --job JOB.json --events-fd N``. For each
export group (case, exporter, opset, options) it builds the case, computes eager references,
exports once, checks the file, then runs every runtime cell of the group. Each finished cell is
sent to the runner as one JSON event on the events pipe; stdout/stderr of a group go to its log.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from harness.core.job import Job
from harness.core.status import Status
from harness.run.bundle import write_bundle
from harness.run.stages import GroupContext, package_versions, run_cell


@contextlib.contextmanager
def redirect_fds(path: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (Python and C level) to ``path`` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_job(job: Job, emit) -> None:
    versions = package_versions()
    emit({"event": "hello", "versions": versions, "pid": os.getpid()})
    run_dir = Path(job.run_dir)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harness-export-") as tmp:
        for group in job.groups:
            emit({"event": "group_start", "gid": group.gid})
            log_path = logs / f"{group.gid}.log"
            ctx = GroupContext(job, group, Path(tmp))
            with redirect_fds(log_path):
                ctx.prepare()
            for cell in group.cells:
                emit({"event": "cell_start", "cell_id": cell.cell_id})
                with redirect_fds(log_path):
                    print(f"=== cell {cell.cell_id} ===", flush=True)
                    rec = run_cell(ctx, cell, versions)
                    rec.log = str(log_path)
                    if rec.status is Status.FAIL and job.bundles:
                        write_bundle(ctx, rec, run_dir / "bundles" / cell.cell_id, log_path)
                emit({"event": "record", "record": rec.to_dict()})
            for p in Path(tmp).glob(f"{group.gid}.onnx*"):
                p.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.run.worker")
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--events-fd", type=int, default=None)
    parser.add_argument("--print", action="store_true", help="print records (repro mode)")
    args = parser.parse_args(argv)
    job = Job.read(args.job)
    faulthandler.enable()
    if args.events_fd is not None:
        stream = os.fdopen(args.events_fd, "w", buffering=1)
    else:
        stream = sys.stdout

    def emit(event: dict[str, Any]) -> None:
        if args.print and event.get("event") != "record":
            return
        payload = event["record"] if args.print else event
        stream.write(json.dumps(payload, default=str) + "\n")
        stream.flush()

    if args.print:
        job = job.replace(bundles=False, run_dir=tempfile.mkdtemp(prefix="harness-repro-"))
    run_job(job, emit)
    emit({"event": "bye"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
