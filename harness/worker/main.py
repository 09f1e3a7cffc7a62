"""The worker: runs inside one environment, imports torch once, runs that environment's cells.

Invoked by the runner as ``python -m harness.worker --job JOB.json --events-fd N
[--groups-fd M]``. For each export group (case, exporter, opset, options) it builds the case,
computes eager references, exports once, checks the file, then runs every runtime cell of the
group. Each finished cell is sent to the runner as one JSON event on the events pipe, the last
one being ``bye``: a worker that ends without it ended early (a case called ``sys.exit`` or
``os._exit``), and the runner treats that as a crash. With ``--groups-fd`` the worker asks for
more groups when its job's are done (a ``want`` event, answered by one JSON group, or ``null``,
on that pipe): the runner hands an environment's groups to whichever of its workers is free.

``Job.phase`` says which stages run: all of them (a bundle's repro), all but latency (a run's
verdict phase: exported files kept in the run's spool), or only latency (the latency phase: the
spooled files timed, torch not even imported). stdout/stderr of a group go to its log
(``GroupLogs``). A process that a case forks never gets past the next line of worker code
(``leave_if_forked``).

Each export group runs in a fresh process forked from the worker (``harness.worker.group_process``): the
worker is the environment's warm parent, which has imported torch, the exporters and the
runtimes but runs nothing itself, so no group sees what an earlier one left in the process.
``HARNESS_WORKER_FORK=0`` runs the groups in the worker itself (the long-lived worker, kept
for the bench).
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from harness.core.events import Bye, CellStart, GroupStart, Hello, RecordDone, StageStart, Want
from harness.core.job import PHASE_ALL, PHASE_LATENCY, PHASE_VERDICTS, ExportGroup, Job, families
from harness.core.status import Status
from harness.core.wire import LOG_MAX_ENV, RELAY_ENV, RUNNER_PID_ENV, SCRATCH_PREFIX, WORKER_MODULE, log_marker
from harness.worker import capture_reuse, evidence, stages
from harness.worker import group_process as fresh
from harness.worker.diagnose.blame import diagnose
from harness.worker.diagnose.bundle import write_bundle
from harness.worker.loaded import CaseFiles, expand_declared
from harness.worker.logcap import cap_file
from harness.worker.spool import read_group_spool
from harness.worker.stages import (
    GroupContext,
    SameFileTimings,
    package_versions,
    run_cell,
    spool_group,
)

# The worker's own pid: a process forked by a case returns into this module's code with another
# pid and must leave at once (``leave_if_forked``), before it writes a log, a bundle or an event.
_WORKER_PID = os.getpid()


def leave_if_forked() -> None:
    """End a process that a case forked (``os.fork()``) when it comes back into the worker loop:
    it must not run the next cells, write logs or bundles, or send events on the runner's pipe.
    ``os._exit``: no atexit handlers, no flush of buffers it shares with the worker."""
    if os.getpid() != _WORKER_PID:
        os._exit(0)


_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _stop_forked_child_in_harness_code() -> None:
    """Runs in every process forked from the worker (``os.register_at_fork``): the child goes on
    running the case's own code (a multiprocessing worker, a daemon), but the moment it calls or
    returns into harness code it is a copy of the worker loop and ends, before it exports, writes
    a file or sends an event. A group's own process, forked by the worker loop, is not one."""
    if fresh.FORKING:
        return

    def profile(frame, event, arg) -> None:
        if frame.f_code is _stop_forked_child_in_harness_code.__code__:
            return   # this hook itself, run again in a grandchild that inherited the profile
        if event == "call":
            here = frame.f_code.co_filename
        elif event == "return" and frame.f_back is not None:
            here = frame.f_back.f_code.co_filename
        else:
            return
        if here.startswith(_HARNESS_DIR):
            os._exit(0)

    sys.setprofile(profile)


def _flush_all() -> None:
    """Flush Python's and C's stdio buffers, so that output lands in the log it was written for."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


class GroupLogs:
    """Where the output of a group's blocks (export, each cell) goes.

    Under the runner's relay (``HARNESS_LOG_RELAY``: venv workers) stdout and stderr are a pipe
    the runner reads; the worker only marks, in that stream, which group the following bytes
    belong to, and the runner writes each log with its cap (and copies it into bundles). Else
    (containers, repro) the block's stdout/stderr are redirected to the group's log file, which
    is capped after each block."""

    def __init__(self, relay: str | None = None, max_bytes: int | None = None) -> None:
        self.relay, self.max_bytes = relay, max_bytes

    @classmethod
    def from_env(cls) -> "GroupLogs":
        cap = os.environ.get(LOG_MAX_ENV, "")
        return cls(os.environ.get(RELAY_ENV) or None, int(cap) if cap.isdigit() else None)

    @contextlib.contextmanager
    def block(self, gid: str, path: Path) -> Iterator[None]:
        if self.relay:
            _flush_all()
            os.write(1, log_marker(self.relay, gid))
            try:
                yield
            finally:
                leave_if_forked()
                _flush_all()
                os.write(1, log_marker(self.relay, ""))
            return
        _flush_all()
        saved = os.dup(1), os.dup(2)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            yield
        finally:
            leave_if_forked()
            _flush_all()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for f in (fd, *saved):
                os.close(f)
            cap_file(path, self.max_bytes)

    def cap(self, path: Path) -> None:
        """Cap the log now (before a bundle copies it); the relay caps as it writes."""
        if not self.relay:
            cap_file(path, self.max_bytes)


def die_with_runner() -> None:
    """Linux: have the kernel SIGKILL this worker when the runner that started it dies (even by
    SIGKILL), so that no worker outlives its run."""
    expected = os.environ.get(RUNNER_PID_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if str(os.getppid()) != expected:   # the runner died before prctl took effect
            os._exit(1)


class GroupFeed:
    """More groups from the runner, one family (a JSON list of groups; a lone group for a runner
    that hands out one) per ``want`` event, read from the groups pipe."""

    def __init__(self, fd: int, emit: Callable[[dict[str, Any]], None]) -> None:
        self.stream = os.fdopen(fd, "r", encoding="utf-8")
        self.emit = emit

    def __call__(self) -> list[ExportGroup] | None:
        self.emit(Want().to_dict())
        line = self.stream.readline()
        leave_if_forked()
        data = json.loads(line) if line.strip() else None
        if isinstance(data, dict):
            data = [data]
        return [ExportGroup.from_dict(d) for d in data] if isinstance(data, list) and data else None


def _families(job: Job, feed: Callable[[], list[ExportGroup] | None] | None) -> Iterator[list[ExportGroup]]:
    yield from families(job.groups)
    while feed is not None and (more := feed()) is not None:
        yield from families(more)


def _became_group_process() -> None:
    global _WORKER_PID
    _WORKER_PID = os.getpid()


class _Runner:
    """The verdict phase's groups in one worker: what every group of the job shares."""

    def __init__(self, job: Job, emit, logs: GroupLogs, versions: dict[str, Any], fork: bool,
                 tmp: str) -> None:
        self.job, self.emit, self.logs, self.versions, self.fork, self.tmp = job, emit, logs, versions, fork, tmp
        self.run_dir = Path(job.run_dir)
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Verdict phase: the file is exported straight into the spool, where the latency phase finds it.
        self.spool = job.phase == PHASE_VERDICTS and (job.latency.enabled or job.keep_spool)
        # One per process: a group's fresh process starts from the warm parent's (empty) one;
        # the long-lived worker (HARNESS_WORKER_FORK=0) keeps the union of its groups' files.
        self.loaded = CaseFiles(exclude=[self.run_dir, tmp])

    def workdir(self, group: ExportGroup) -> Path:
        workdir = self.job.spool / group.gid if self.spool else Path(self.tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir

    def plan(self, families: Iterator[list[ExportGroup]]) -> Iterator[tuple[str, list[ExportGroup], str | None]]:
        """In the warm parent: what to run next, ("shared", family, None) where a family may
        share one capture, else ("alone", [group], why not) per group. A family whose capture
        could not be shared (its process leaves the reason in ``_refused``) then runs each group
        in a process forked from the warm parent, untouched by that attempt: its verdicts, errors
        and notes are the per-opset ones."""
        for groups in (part for family in families for part in capture_reuse.by_registry(self.versions["torch"], family)):
            first = groups[0]
            reason = capture_reuse.refusal(first.exporter, first.options, self.versions["torch"], len(groups),
                                           self.fork, self.job.determinism)
            if reason is None:
                yield "shared", groups, None
                refused = self._refused(first)
                if not refused.exists():
                    continue
                reason = refused.read_text(encoding="utf-8")
            for group in groups:
                yield "alone", [group], reason

    def _refused(self, first: ExportGroup) -> Path:
        return Path(self.tmp) / f"{first.gid}.refused"

    def shared(self, groups: list[ExportGroup]) -> None:
        """In a family's own process: the reference stage and torch's capture once, then each
        group in a process forked from this one, exporting from the capture. Where there is no
        capture to share, the reason is left for the warm parent (``plan``) and nothing runs here."""
        first = groups[0]
        # The family's process announces itself with its first group (a death here is charged to it).
        self.emit(GroupStart(gid=first.gid, parent=fresh.PARENT).to_dict())
        shared = GroupContext(self.job, first, self.workdir(first))
        with self.logs.block(first.gid, self.log_dir / f"{first.gid}.log"):
            with self.loaded.watch():
                shared.capture_for_family(Path(self.tmp) / f"{first.gid}.capture.onnx")
        if shared.capture is None or not shared.capture.ok:
            why = shared.capture.reason if shared.capture is not None else "the reference stage failed"
            self._refused(first).write_text(why or "no capture", encoding="utf-8")
            return
        for group in fresh.per_group(groups, on_child=_became_group_process):
            ctx = shared.for_group(group, self.workdir(group))
            self.group(ctx, None, shared_by=len(groups))

    def group(self, ctx: GroupContext, reason: str | None, shared_by: int = 1) -> None:
        """One export group: prepare (reference, export, check), then each runtime cell."""
        job, group, logs, emit = self.job, ctx.group, self.logs, self.emit
        ctx.made = capture_reuse.made(ctx.capture, reason, shared_by)
        emit(GroupStart(gid=group.gid, parent=fresh.PARENT).to_dict())
        log_path = self.log_dir / f"{group.gid}.log"
        with logs.block(group.gid, log_path):
            with self.loaded.watch():
                ctx.prepare()
            if ctx.failure is None:
                ctx.made["sha256"] = capture_reuse.file_digest(ctx.onnx_path)
            if ctx.capture is not None and "translation" in ctx.capture.facts:
                ctx.made["translation"] = ctx.capture.facts["translation"]
            case_files = group_case_files(self.loaded, ctx, job)
            spool_error = None
            if self.spool and ctx.failure is None:
                try:
                    spool_group(ctx, self.versions["torch"])
                except Exception as exc:  # noqa: BLE001 - the latency phase fails these cells, naming it
                    traceback.print_exc()
                    spool_error = f"the exported file could not be kept for the phases after the verdict: {type(exc).__name__}: {exc}"[:300]
        ctx.evidence_dir = Path(self.tmp) / "evidence"   # also the family's layer experiments
        with evidence.shared(ctx, ctx.evidence_dir):
            self.cells(ctx, case_files, spool_error, log_path)
        if not self.spool:
            for p in Path(self.tmp).glob(f"{group.gid}.onnx*"):
                p.unlink()

    def cells(self, ctx: GroupContext, case_files: dict[str, str], spool_error: str | None, log_path: Path) -> None:
        job, group, logs, emit = self.job, ctx.group, self.logs, self.emit
        for cell in group.cells:
            emit(CellStart(cell_id=cell.cell_id).to_dict())
            with logs.block(group.gid, log_path):
                print(f"=== cell {cell.cell_id} ===", flush=True)
                rec = run_cell(ctx, cell, self.versions)
                diagnose(ctx, cell, rec)   # a failing cell's blame (nothing on a pass)
                rec.log = str(log_path)
                rec.case_files = dict(case_files)
                if spool_error:
                    rec.notes.append(spool_error)   # what the latency phase and the floors then miss
                if rec.status is Status.FAIL and job.bundles:
                    logs.cap(log_path)
                    try:
                        write_bundle(ctx, rec, self.run_dir / "bundles" / cell.cell_id, log_path)
                    except Exception as exc:  # noqa: BLE001 - the cell keeps its verdict; no bundle is said
                        traceback.print_exc()
                        rec.pass_not_run("bundle", f"the bundle could not be written: {type(exc).__name__}: {exc}")
            emit(RecordDone(record=rec.to_dict()).to_dict())


def run_job(job: Job, emit, logs: GroupLogs | None = None,
            feed: Callable[[], list[ExportGroup] | None] | None = None, fork: bool = False) -> None:
    """Run the job's groups (and those ``feed`` hands out), family by family; with ``fork``, each
    family in a fresh process forked from this one and each of its groups in a process forked
    from the family's (``harness.worker.group_process``; the caller wraps this in
    ``fresh.contained``)."""
    logs = logs or GroupLogs()
    if job.phase == PHASE_LATENCY:
        run_latency_job(job, emit, logs)
        return
    preloaded = fresh.preload() if fork else []
    versions = package_versions()
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as tmp:
        emit(Hello(versions=versions, pid=os.getpid(), fresh=fork, preloaded=preloaded,
                   threads=fresh.thread_count(), scratch=tmp).to_dict())
        stages.on_stage_start = lambda which: emit(StageStart(stage=which.value).to_dict())
        runner = _Runner(job, emit, logs, versions, fork, tmp)
        todo = runner.plan(_families(job, feed))
        if fork:
            todo = fresh.per_group(todo, on_child=_became_group_process)
        for kind, groups, reason in todo:
            if kind == "shared":
                runner.shared(groups)
            else:
                runner.group(GroupContext(job, groups[0], runner.workdir(groups[0])), reason)


def group_case_files(loaded: CaseFiles, ctx: GroupContext, job: Job) -> dict[str, str]:
    """The record's ``case_files``: what the case's stages loaded, and the files it declares."""
    base = Path(job.base_dir)
    declared = expand_declared(ctx.group.data_files, base)
    declared += list(getattr(ctx.spec, "data_files", ()) or ())
    try:
        return loaded.digests(base, declared)
    except Exception:  # noqa: BLE001 - never lose a cell over its bookkeeping; it is not reused
        traceback.print_exc()
        return {"<unreadable>": "?"}


def run_latency_job(job: Job, emit, logs: GroupLogs) -> None:
    """The latency phase in one environment: each group's spooled file, loaded again in each
    cell's runtime and timed (the runner starts this worker when nothing else runs), once per
    file, feeds and runtime settings (``SameFileTimings``). Each record holds the timing only; the
    runner joins it to the cell's verdict."""
    emit(Hello(versions={}, pid=os.getpid()).to_dict())
    run_dir = Path(job.run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    timings = SameFileTimings()
    for group in job.groups:
        emit(GroupStart(gid=group.gid).to_dict())
        log_path = run_dir / "logs" / f"{group.gid}.log"
        with logs.block(group.gid, log_path):
            spooled = read_group_spool(job.spool, group.gid)
        for cell in group.cells:
            emit(CellStart(cell_id=cell.cell_id).to_dict())
            with logs.block(group.gid, log_path):
                print(f"=== latency {cell.cell_id} ===", flush=True)
                rec = timings.time(job, group, cell, spooled)
                rec.log = str(log_path)
                if rec.status is Status.FAIL and job.bundles and spooled.error is None:
                    ctx = GroupContext(job, group, spooled.onnx.parent)
                    ctx.feeds = [spooled.feeds]
                    logs.cap(log_path)
                    write_bundle(ctx, rec, run_dir / "bundles" / cell.cell_id, log_path)
            emit(RecordDone(record=rec.to_dict()).to_dict())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=WORKER_MODULE)
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--events-fd", type=int, default=None)
    parser.add_argument("--groups-fd", type=int, default=None,
                        help="ask the runner for more groups on this pipe when the job's are done")
    parser.add_argument("--print", action="store_true", help="print records (repro mode)")
    args = parser.parse_args(argv)
    global _WORKER_PID
    _WORKER_PID = os.getpid()
    os.register_at_fork(after_in_child=_stop_forked_child_in_harness_code)
    die_with_runner()
    job = Job.read(args.job)
    faulthandler.enable()
    if args.events_fd is not None:
        stream = os.fdopen(args.events_fd, "w", buffering=1)
    else:
        stream = sys.stdout

    def emit(event: dict[str, Any]) -> None:
        leave_if_forked()
        if args.print and event.get("event") != "record":
            return
        payload = event["record"] if args.print else {**event, "pid": os.getpid()}
        stream.write(json.dumps(payload, default=str) + "\n")
        stream.flush()

    if args.print:
        job = job.replace(bundles=False, run_dir=tempfile.mkdtemp(prefix="harness-repro-"), phase=PHASE_ALL)
    feed = GroupFeed(args.groups_fd, emit) if args.groups_fd is not None else None
    with fresh.contained():
        run_job(job, emit, GroupLogs() if args.print else GroupLogs.from_env(), feed, fork=fresh.enabled())
    emit(Bye().to_dict())
    return 0
