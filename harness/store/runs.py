"""The results store: reports/runs/<run-id>/ with results.jsonl + run.json, an index, a latest pointer.

A run directory is written by one runner at a time: ``run_dir_lock`` holds an exclusive lock
(``filelock``, an flock that the kernel releases when its process dies, so a killed runner never
leaves a stale lock) and names its holder in ``.runner.json`` for the one that is refused.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from harness.core.paths import REPORTS
from harness.core.record import (
    SCHEMA_VERSION,
    Record,
    SchemaError,
    count_by_status,
    read_records,
)
from harness.core.run import RunMeta
from harness.core.text import ENCODE_ERRORS
from harness.matrix.rules import ConfigError

LOCK_FILE = ".runner.lock"
HOLDER_FILE = ".runner.json"


class RunDirBusy(ConfigError):
    """Another runner holds the run directory (exit 2, with its pid)."""


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir`` (created if missing) for this process, or raise ``RunDirBusy`` naming the
    process that does. Everything that writes results.jsonl or run.json runs inside it."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: --output must be a directory (it is a file)")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_dir / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirBusy(f"{run_dir}: in use by another runner ({lock_holder(run_dir)}); "
                         "wait for it to end, or stop it and resume") from None
    holder = run_dir / HOLDER_FILE
    write_json_atomic(holder, {"pid": os.getpid(), "host": socket.gethostname(),
                               "since": time.time(), "argv": sys.argv})
    try:
        yield run_dir
    finally:
        with contextlib.suppress(OSError):
            holder.unlink()
        lock.release()


def lock_holder(run_dir: Path) -> str:
    """'pid N on HOST since TIME' from the holder file, as far as it can be read."""
    try:
        info = json.loads((Path(run_dir) / HOLDER_FILE).read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on {info.get('host', '?')} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown: it has not written .runner.json yet"


def runs_root(reports: Path = REPORTS) -> Path:
    return reports / "runs"


def new_run_id(matrix_hash: str) -> str:
    """``YYYYMMDD-HHMMSSmmm-<matrix hash>-<random>``: UTC time to the millisecond, the matrix
    hash's first 6 characters, 6 random hex digits. Unique across stores (two runs of one matrix
    started in one millisecond on two machines differ by the random part) and sorted by time as
    text, after the ids of earlier releases (``YYYYMMDD-HHMMSS-<hash>``, still read as they are)."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"
    return f"{stamp}-{matrix_hash[:6]}-{secrets.token_hex(3)}"


def claim_new_run(reports: Path, matrix_hash: str) -> tuple[str, Path]:
    """A fresh run id and its directory in the store, created atomically: two runs of one matrix
    started within the same second (a gate's two sides, concurrent CI jobs) get distinct ids
    and never share a directory (a taken id gets ``-2``, ``-3``, …)."""
    base = new_run_id(matrix_hash)
    root = runs_root(reports)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        run_id = base if n == 1 else f"{base}-{n}"
        try:
            (root / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id, root / run_id
    raise RuntimeError(f"{root}: no free run id for {base}")


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
    if isinstance(data, dict):
        for key, types, expected in _META_FIELDS:
            types = types if isinstance(types, tuple) else (types,)
            value = data.get(key)
            if key in data and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
                raise SchemaError(f"{path}: '{key}' must be {expected} (got {json.dumps(data[key])[:60]})")
    return RunMeta.from_dict(data, str(path))


_NUM = (int, float)
_META_FIELDS = (
    ("run_id", str, "a string"), ("schema", int, "an integer"), ("finished", bool, "true or false"),
    ("matrix_hash", str, "a string"), ("config", str, "a string"), ("harness", str, "a string"),
    ("started", _NUM, "a number"), ("ended", (*_NUM, type(None)), "a number or null"),
    ("environments", dict, "an object"), ("plan", dict, "an object"), ("host", dict, "an object"),
    ("resumed", list, "a list"), ("counts", (dict, type(None)), "an object or null"),
    ("fingerprint", (dict, type(None)), "an object or null"),
    ("base_dir", (str, type(None)), "a string or null"),
    ("passes_not_run", (list, type(None)), "a list or null"),
)


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
REPORT_FILES = ("matrix.md", "matrix.html", "plots/latency.svg", "plots/parity.svg",
                "plots/latency.key", "plots/parity.key")
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
        tmp.write_text(content, encoding="utf-8", errors=ENCODE_ERRORS)
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
    try:
        index = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: not valid JSON ({exc}); delete it, the next finished run "
                          "rewrites it") from None
    if not isinstance(index, dict) or not isinstance(index.get("runs", []), list) \
            or not isinstance(index.get("schema", 1), int):
        raise SchemaError(f"{path}: expected an object with 'schema' and a list 'runs'; delete it, "
                          "the next finished run rewrites it")
    if int(index.get("schema", 1)) > SCHEMA_VERSION:
        raise SchemaError(f"{path}: written by a newer harness (schema {index['schema']}); upgrade to read it")
    runs = [r for r in index.get("runs", []) if isinstance(r, dict) and isinstance(r.get("run_id"), str)
            and isinstance(r.get("dir"), str)]
    return sorted(runs, key=lambda r: r.get("started") if isinstance(r.get("started"), (int, float)) else 0)


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
