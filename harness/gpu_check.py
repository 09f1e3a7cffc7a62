"""GPU verification: run the probes on the GPU runtimes and print one line per cell.

``python -m harness gpu-check [--config FILE] [--output DIR]`` (``nox -s gpu-check``). Without an
NVIDIA GPU every cell is a skip with its reason and the exit code is 0; with one, the exit code
is 1 when a runtime passes no cell at all or a cell crashed (the runtime itself is broken),
while model-level failures of single probes are shown but do not fail the check.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from tabulate import tabulate

from harness.core.record import Record, read_records
from harness.core.status import Status
from harness.matrix_run import MatrixRequest, run_matrix

GPU_MATRIX = Path(__file__).resolve().parent / "matrices" / "gpu.yaml"


def detail(rec: Record) -> str:
    if rec.status is Status.SKIP:
        return rec.reason or ""
    if rec.status is Status.PASS:
        lat = rec.latency_ms.median
        facts = rec.graph.get("runtime_facts", {})
        where = facts.get("providers") or facts.get("device") or ""
        return (f"{lat:.3f} ms " if lat is not None else "") + f"max_abs {rec.parity.max_abs or 0:.1e} {where}"
    return f"{rec.stage}: {rec.error}"


def verdict(records: list[Record]) -> tuple[int, str]:
    if all(r.status is Status.SKIP for r in records):
        return 0, "all GPU cells skipped (see reasons above)"
    broken = [r.cell_id for r in records if r.status.worker_died]
    dead = sorted({r.runtime for r in records} - {r.runtime for r in records if r.status is Status.PASS})
    if broken or dead:
        return 1, f"runtimes with no passing cell: {dead}; crashed/timed out: {broken}"
    return 0, "every GPU runtime passed at least one probe"


def run_gpu_check(config: Path, output: Path | None) -> int:
    """Run the GPU matrix, print a table, and say whether every GPU runtime works at all."""
    out = output or Path(tempfile.mkdtemp(prefix="gpu-check-")) / "run"
    run_matrix(MatrixRequest(config, out, reports=out.parent / "store"))
    records = sorted(read_records(out / "results.jsonl"), key=lambda r: (r.runtime, r.case, r.exporter, r.opset))
    rows = [[r.runtime, r.case, r.exporter, r.opset, r.status.value, detail(r)[:140]] for r in records]
    print(tabulate(rows, headers=["runtime", "case", "exporter", "opset", "status", "detail"], tablefmt="github"))
    code, summary = verdict(records)
    print(f"gpu-check: {summary} ({out})")
    return code
