"""The proof behind capture reuse: every dynamo export group of a job exported both ways, in one
torch environment, and the files compared.

    python -m harness.worker.capture_proof --job JOB.json --out DIR

For each family of the job's groups (``ExportGroup.capture_key``): each group exported on its
own, in a fresh copy of this warm process (the per-opset call, as a run makes it with
``HARNESS_CAPTURE_REUSE=0``, and with torch.onnx's own torchlib table, made again at each call),
then the family's capture made once and each group exported from it in a process forked from the
capture's, with the table kept (as a run makes it). One JSON line per group on
stdout: both files' digests, and where they differ, which parts (opset imports, graph nodes,
initializers, metadata, the rest); a failed export's stage and error on either side. Before them,
one line per family with what each way cost (wall and CPU seconds; the two ways alternate which
runs first), the side-by-side measure ``nox -s bench`` reports.
``tests/run/test_capture_reuse.py`` runs it on every torch release of matrix.yaml.

Worker side: runs inside a torch environment.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.core.errors import short_error
from harness.core.job import ExportGroup, Job, families
from harness.worker import capture_reuse
from harness.worker import group_process as fresh
from harness.worker.stages import GroupContext


def _table() -> str:
    """Whether this process's dynamo exports took torchlib's table as kept by the worker."""
    return "kept" if fresh.torchlib_table_kept() else "plain"


def _outcome(ctx: GroupContext) -> dict[str, Any]:
    if ctx.failure is not None:
        return {"failure": f"{ctx.failure.stage.value}: {short_error(ctx.failure.exc)}", "notes": ctx.notes,
                "made": ctx.made, "table": _table()}
    return {"digest": capture_reuse.file_digest(ctx.onnx_path), "file": str(ctx.onnx_path),
            "notes": ctx.notes, "made": ctx.made, "table": _table()}


def _write(path: Path, data: dict[str, Any]) -> bool:
    path.write_text(json.dumps(data, default=str), encoding="utf-8")
    return True


def alone(job: Job, group: ExportGroup, out: Path) -> None:
    """The group's export on its own, in a fresh copy of this process, with torch.onnx's export
    as it comes (no kept torchlib table: ``group_process.keep_torchlib_table``)."""
    def run() -> bool:
        fresh.forget_torchlib_table()
        ctx = GroupContext(job, group, out)
        ctx.prepare()
        return _write(out / f"{group.gid}.json", _outcome(ctx))
    fresh.in_fresh_copy(run)


def shared(job: Job, family: list[ExportGroup], out: Path) -> None:
    """The family's capture once, in a fresh copy of this process; each group's export from it in
    a copy of that one. Where no capture could be shared, each group on its own from this
    process, as the worker does (``harness.worker.main``)."""
    refused = out / "refused"

    def run() -> bool:
        ctx = GroupContext(job, family[0], out)
        ctx.capture_for_family(out / "capture.onnx")
        if ctx.capture is None or not ctx.capture.ok:
            refused.write_text((ctx.capture.reason if ctx.capture is not None else None) or "no capture")
            return True
        for group in family:
            def one(group: ExportGroup = group) -> bool:
                mine = ctx.for_group(group, out)
                mine.made = capture_reuse.made(mine.capture, None, len(family))
                mine.prepare()
                if "translation" in mine.capture.facts:
                    mine.made["translation"] = mine.capture.facts["translation"]
                return _write(out / f"{group.gid}.json", _outcome(mine))
            fresh.in_fresh_copy(one)
        return True
    fresh.in_fresh_copy(run)
    if refused.exists():
        reason = refused.read_text()
        for group in family:
            def alone_refused(group: ExportGroup = group) -> bool:
                ctx = GroupContext(job, group, out)
                ctx.made = capture_reuse.made(None, reason)
                ctx.prepare()
                return _write(out / f"{group.gid}.json", _outcome(ctx))
            fresh.in_fresh_copy(alone_refused)


def differing_parts(a: Path, b: Path) -> list[str]:
    """Which parts of two ONNX files differ: opset_import, ir_version, io, nodes, initializers,
    functions, metadata; "other" when the parts are equal but the bytes are not."""
    import onnx
    from onnx import numpy_helper

    ma, mb = onnx.load(str(a)), onnx.load(str(b))
    ser = lambda items: [x.SerializeToString(deterministic=True) for x in items]
    parts = {
        "opset_import": (ser(ma.opset_import), ser(mb.opset_import)),
        "ir_version": (ma.ir_version, mb.ir_version),
        "io": (ser([*ma.graph.input, *ma.graph.output]), ser([*mb.graph.input, *mb.graph.output])),
        "nodes": (ser(ma.graph.node), ser(mb.graph.node)),
        "initializers": ([(t.name, numpy_helper.to_array(t).tobytes()) for t in ma.graph.initializer],
                         [(t.name, numpy_helper.to_array(t).tobytes()) for t in mb.graph.initializer]),
        "functions": (ser(ma.functions), ser(mb.functions)),
        "metadata": (ser(ma.metadata_props), ser(mb.metadata_props)),
        "value_info": (ser(ma.graph.value_info), ser(mb.graph.value_info)),
    }
    return [name for name, (x, y) in parts.items() if x != y] or ["other"]


def compare(group: ExportGroup, per: dict[str, Any], reused: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"case": group.case, "opset": group.opset, "gid": group.gid,
                           "per_opset": per.get("digest") or per.get("failure"),
                           "reused": reused.get("digest") or reused.get("failure"),
                           "made": (reused.get("made") or {}).get("how"),
                           "translation": (reused.get("made") or {}).get("translation"),
                           "reason": (reused.get("made") or {}).get("reason"),
                           "tables": [per.get("table"), reused.get("table")]}
    row["same"] = row["per_opset"] == row["reused"] and per.get("notes") == reused.get("notes")
    if not row["same"] and per.get("digest") and reused.get("digest"):
        row["differs"] = differing_parts(Path(per["file"]), Path(reused["file"]))
    if per.get("notes") != reused.get("notes"):
        row["notes"] = [per.get("notes"), reused.get("notes")]
    return row


def _timed(fn: Any) -> dict[str, float]:
    """Wall seconds, and CPU seconds of the processes it forked and waited for."""
    import resource
    import time

    def cpu() -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return kids.ru_utime + kids.ru_stime
    wall0, cpu0 = time.perf_counter(), cpu()
    fn()
    return {"wall_s": round(time.perf_counter() - wall0, 3), "cpu_s": round(cpu() - cpu0, 3)}


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="capture_proof")
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    job = Job.read(args.job)
    out = args.out or Path(tempfile.mkdtemp(prefix="capture-proof-"))
    fresh.preload()
    torch_version = _torch_version()
    parts = (part for family in families([g for g in job.groups if g.exporter == "dynamo"])
             for part in capture_reuse.by_registry(torch_version, family))
    for n, family in enumerate(parts):
        key = family[0].gid
        per_dir, reuse_dir = out / key / "per-opset", out / key / "reused"
        for d in (per_dir, reuse_dir):
            d.mkdir(parents=True, exist_ok=True)
        ways = [("per_opset", lambda: [alone(job, g, per_dir) for g in family]),
                ("reused", lambda: shared(job, family, reuse_dir))]
        if n % 2:
            ways.reverse()   # interleaved: neither way always runs first
        cost: dict[str, Any] = {"family": key, "groups": len(family)}
        for name, way in ways:
            cost.update({f"{name}_{k}": v for k, v in _timed(way).items()})
        print(json.dumps(cost), flush=True)
        for group in family:
            read = lambda d: json.loads(p.read_text()) if (p := d / f"{group.gid}.json").exists() else {}
            print(json.dumps(compare(group, read(per_dir), read(reuse_dir)), default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)   # no atexit of torch's in a process that forked


if __name__ == "__main__":
    sys.exit(main())
