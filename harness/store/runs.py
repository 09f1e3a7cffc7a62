"""The results store: reports/runs/<run-id>/ with results.jsonl + run.json, an index, a latest pointer."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.core.paths import REPORTS
from harness.core.record import (
    SCHEMA_VERSION,
    Record,
    SchemaError,
    count_by_status,
    read_records,
)
from harness.core.run import RunMeta


def runs_root(reports: Path = REPORTS) -> Path:
    return reports / "runs"


def new_run_id(matrix_hash: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{matrix_hash[:6]}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def read_run_meta(run_dir: Path) -> RunMeta:
    path = Path(run_dir) / "run.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no run.json)")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: not valid JSON ({exc})") from None
    return RunMeta.from_dict(data, str(path))


def load_run(run_dir: Path) -> tuple[RunMeta, list[Record]]:
    from harness.store.reductions import with_reductions

    return read_run_meta(run_dir), with_reductions(run_dir, read_records(Path(run_dir) / "results.jsonl"))


def list_runs(reports: Path = REPORTS) -> list[Path]:
    root = runs_root(reports)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if (p / "run.json").exists())


def resolve_run(ref: str, reports: Path = REPORTS) -> Path:
    """A run directory from a path, a run id, or 'latest'."""
    path = Path(ref)
    if (path / "run.json").exists():
        return path
    if ref == "latest":
        pointer = reports / "latest"
        if pointer.exists():
            return pointer.resolve()
        runs = list_runs(reports)
        if runs:
            return runs[-1]
    candidate = runs_root(reports) / ref
    if (candidate / "run.json").exists():
        return candidate
    raise FileNotFoundError(f"no run {ref!r} (looked for a run directory, a run id under "
                            f"{runs_root(reports)}, or 'latest')")


# Files a re-render may write into a finished run; everything else there is immutable.
REPORT_FILES = ("matrix.md", "matrix.html", "plots/latency.svg", "plots/parity.svg")
IMMUTABLE_FILES = ("results.jsonl", "run.json")


def write_report_file(run_dir: Path, name: str, content: str | bytes) -> Path:
    """Write one report file of a run; refuses the run's results and metadata."""
    if name not in REPORT_FILES:
        raise ValueError(f"{name!r} is not a report file; a finished run is never rewritten "
                         f"(report files: {', '.join(REPORT_FILES)})")
    path = Path(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(content, bytes):
        tmp.write_bytes(content)
    else:
        tmp.write_text(content, encoding="utf-8")
    os.replace(tmp, path)
    return path


def cell_log_path(run_dir: Path, record: Record) -> Path | None:
    """The cell's log, also when the run directory was moved (fixtures, copies, published sites)."""
    if not record.log:
        return None
    recorded = Path(record.log)
    for candidate in (recorded, Path(run_dir) / "logs" / recorded.name):
        if candidate.is_file():
            return candidate
    return None


def read_index(reports: Path = REPORTS) -> list[dict[str, Any]]:
    """Index entries, oldest first; an absent index is an empty store."""
    path = reports / "index.json"
    if not path.exists():
        return []
    index = json.loads(path.read_text())
    if int(index.get("schema", 1)) > SCHEMA_VERSION:
        raise SchemaError(f"{path}: written by a newer harness (schema {index['schema']}); upgrade to read it")
    return sorted(index.get("runs", []), key=lambda r: r.get("started") or 0)


def torch_counts(records: list[Record]) -> dict[str, dict[str, int]]:
    """Per torch version: cells that passed and cells that count (skips are not attempts)."""
    out: dict[str, dict[str, int]] = {}
    for rec in records:
        slot = out.setdefault(rec.torch, {"passed": 0, "cells": 0})
        slot["cells"] += rec.status.attempted
        slot["passed"] += rec.status.passed
    return out


def update_index(run_dir: Path, reports: Path = REPORTS) -> None:
    """reports/index.json lists finished runs; reports/latest points at the newest one."""
    run_dir = Path(run_dir).resolve()
    try:
        run_dir.relative_to(runs_root(reports).resolve())
    except ValueError:
        return  # a run written with --output elsewhere is not part of this store
    meta, records = load_run(run_dir)
    runs = [r for r in read_index(reports) if r["run_id"] != meta.run_id]
    runs.append({
        "run_id": meta.run_id, "dir": str(run_dir.relative_to(reports.resolve())),
        "started": meta.started, "ended": meta.ended,
        "torch": sorted({r.torch for r in records}), "counts": count_by_status(records),
        "by_torch": torch_counts(records),
    })
    runs.sort(key=lambda r: r["started"])
    write_json_atomic(reports / "index.json", {"schema": SCHEMA_VERSION, "runs": runs})
    latest = reports / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    # Relative, so the store can be moved or checked out elsewhere and still resolve.
    latest.symlink_to(Path(runs[-1]["dir"]))
