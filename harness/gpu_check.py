"""GPU verification: run the probes on the GPU runtimes and print one line per cell.

``python -m harness.gpu_check [--config FILE] [--output DIR]`` (``nox -s gpu-check``). Without an
NVIDIA GPU every cell is a skip with its reason and the exit code is 0; with one, the exit code
is 1 when a runtime passes no cell at all or a cell crashed (the runtime itself is broken),
while model-level failures of single probes are shown but do not fail the check.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

from harness.records import Record, read_records

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "tests" / "matrices" / "gpu.yaml"


def detail(rec: Record) -> str:
    if rec.status == "skip":
        return rec.reason or ""
    if rec.status == "pass":
        lat = (rec.latency_ms or {}).get("median")
        facts = (rec.graph or {}).get("runtime_facts", {})
        where = facts.get("providers") or facts.get("device") or ""
        return (f"{lat:.3f} ms " if lat is not None else "") + f"max_abs {(rec.parity or {}).get('max_abs', 0):.1e} {where}"
    return f"{rec.stage}: {rec.error}"


def verdict(records: list[Record]) -> tuple[int, str]:
    if all(r.status == "skip" for r in records):
        return 0, "all GPU cells skipped (see reasons above)"
    broken = [r.cell_id for r in records if r.status in ("crash", "timeout")]
    dead = sorted({r.runtime for r in records} - {r.runtime for r in records if r.status == "pass"})
    if broken or dead:
        return 1, f"runtimes with no passing cell: {dead}; crashed/timed out: {broken}"
    return 0, "every GPU runtime passed at least one probe"


def main(argv: list[str] | None = None) -> int:
    from harness.cli import main as harness_main

    parser = argparse.ArgumentParser(prog="harness.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.output or Path(tempfile.mkdtemp(prefix="gpu-check-")) / "run"
    rc = harness_main(["--reports", str(out.parent / "store"), "matrix", "--config", str(args.config),
                       "--output", str(out)])
    if rc != 0:
        return rc
    records = sorted(read_records(out / "results.jsonl"), key=lambda r: (r.runtime, r.case, r.exporter, r.opset))
    rows = [[r.runtime, r.case, r.exporter, r.opset, r.status, detail(r)[:140]] for r in records]
    print(tabulate(rows, headers=["runtime", "case", "exporter", "opset", "status", "detail"], tablefmt="github"))
    code, summary = verdict(records)
    print(f"gpu-check: {summary} ({out})")
    return code


if __name__ == "__main__":
    sys.exit(main())
