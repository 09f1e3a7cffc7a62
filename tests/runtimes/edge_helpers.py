"""Shared by the edge-runtime tests: a direct run (tests/direct_edge.py) of a matrix's cells."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import ROOT, TESTS

from harness.probes import PROBES


def direct_verdicts(records, runtime: str, python: Path, tmp: Path, env: dict | None = None) -> dict[tuple, dict]:
    """tests/direct_edge.py's verdict per (case, exporter, opset) for ``runtime``'s records: the
    harness's own file where a failing cell kept it (its bundle), else a plain re-export."""
    items = []
    for r in records:
        if r.runtime != runtime:
            continue
        item = {"case": r.case, "target": PROBES[r.case], "exporter": r.exporter, "opset": r.opset}
        if r.bundle and (Path(r.bundle) / "model.onnx").exists():
            item["model"] = str(Path(r.bundle) / "model.onnx")
        items.append(item)
    (tmp / "cells.json").write_text(json.dumps(items))
    subprocess.run([str(python), str(TESTS / "direct_edge.py"), runtime, str(tmp / "cells.json"), str(tmp / "out.jsonl")],
                   check=True, cwd=ROOT, capture_output=True, timeout=900,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})})
    rows = [json.loads(line) for line in (tmp / "out.jsonl").read_text().splitlines()]
    return {(d["case"], d["exporter"], d["opset"]): d for d in rows}


def compare(records, runtime: str, direct: dict[tuple, dict]) -> list[str]:
    """Cells whose harness verdict (status, failing stage) differs from the direct run's."""
    bad = []
    for r in records:
        if r.runtime != runtime:
            continue
        d = direct[(r.case, r.exporter, r.opset)]
        if (r.status.value, r.stage if r.status.value == "fail" else None) != (d["status"], d["stage"]):
            bad.append(f"{r.case}/{r.exporter}/op{r.opset}: harness {r.status.value}@{r.stage} {r.error} "
                       f"vs direct {d['status']}@{d['stage']} {d['error']}")
    return bad
