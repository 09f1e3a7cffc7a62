"""The results store: reports/runs/<run-id>/ with results.jsonl + run.json, an index, a latest pointer."""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

from harness import SCHEMA_VERSION, __version__
from harness.records import Record, SchemaError, read_records

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def runs_root(reports: Path = REPORTS) -> Path:
    return reports / "runs"


def new_run_id(matrix_hash: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{matrix_hash[:6]}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no run.json)")
    meta = json.loads(path.read_text())
    if int(meta.get("schema", 1)) > SCHEMA_VERSION:
        raise SchemaError(f"{path}: written by a newer harness (schema {meta['schema']}); upgrade to read it")
    return meta


def start_run_meta(run_dir: Path, run_id: str, config_path: Path, matrix_hash: str,
                   plan_summary: dict[str, Any]) -> dict[str, Any]:
    meta = {
        "schema": SCHEMA_VERSION, "harness": __version__, "run_id": run_id,
        "started": time.time(), "ended": None, "finished": False,
        "host": {"name": socket.gethostname(), "platform": platform.platform(),
                 "cpus": os.cpu_count(), "python": platform.python_version()},
        "config": str(config_path), "matrix_hash": matrix_hash, "plan": plan_summary,
        "environments": {}, "resumed": [],
    }
    write_json_atomic(run_dir / "run.json", meta)
    return meta


def load_run(run_dir: Path) -> tuple[dict[str, Any], list[Record]]:
    return read_run_meta(run_dir), read_records(Path(run_dir) / "results.jsonl")


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


def update_index(run_dir: Path, reports: Path = REPORTS) -> None:
    """reports/index.json lists finished runs; reports/latest points at the newest one."""
    run_dir = Path(run_dir).resolve()
    try:
        run_dir.relative_to(runs_root(reports).resolve())
    except ValueError:
        return  # a run written with --output elsewhere is not part of this store
    meta, records = load_run(run_dir)
    index_path = reports / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"runs": []}
    index["runs"] = [r for r in index["runs"] if r["run_id"] != meta["run_id"]]
    from harness.records import count_by_status

    index["runs"].append({
        "run_id": meta["run_id"], "dir": str(run_dir.relative_to(reports.resolve())),
        "started": meta["started"], "ended": meta["ended"],
        "torch": sorted({r.torch for r in records}), "counts": count_by_status(records),
    })
    index["runs"].sort(key=lambda r: r["started"])
    write_json_atomic(index_path, index)
    latest = reports / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(run_dir.relative_to(reports.resolve()))
