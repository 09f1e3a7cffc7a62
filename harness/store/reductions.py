"""Reductions of a run's failing cells (``harness reduce``): ``reductions.jsonl`` beside the
results, one line per reduction, joined into ``record.graph["reduced"]`` when the run is read.

A finished run's results.jsonl is never rewritten; what is learnt about its cells afterwards
lives in this file (the newest line per cell wins).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.core.record import Record
from harness.core.text import ENCODE_ERRORS

REDUCTIONS_FILE = "reductions.jsonl"


def append_reduction(run_dir: Path, cell_id: str, outcome: dict[str, Any]) -> None:
    line = json.dumps({"cell_id": cell_id, "at": time.time(), "reduced": outcome}, sort_keys=True)
    with open(Path(run_dir) / REDUCTIONS_FILE, "a", encoding="utf-8", errors=ENCODE_ERRORS) as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_reductions(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = Path(run_dir) / REDUCTIONS_FILE
    if not path.exists():
        return {}
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue   # a torn last line
        if isinstance(entry, dict) and isinstance(entry.get("reduced"), dict):
            out[str(entry.get("cell_id"))] = entry["reduced"]
    return out


def with_reductions(run_dir: Path, records: list[Record]) -> list[Record]:
    """The records with their reductions joined in (records of a run without any are unchanged)."""
    reductions = read_reductions(run_dir)
    for rec in records:
        if rec.cell_id in reductions:
            rec.graph = {**rec.graph, "reduced": reductions[rec.cell_id]}
    return records
