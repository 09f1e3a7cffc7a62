"""The cell cache: a cell whose inputs have not changed is taken from the store, not run again.

A cell's key (``KeyContext.key``) is a digest of everything that decides its record:

- the environment's exact installed package set (``EnvMarker.identity``: a new torch nightly,
  an onnx bump, anything the resolver picked differently changes it; for an existing environment
  also each distribution's files' hashes, so one changed in place runs its cells again), its
  Python and provider;
- the case: its label and reference, the hash of its source file and of the data files its matrix
  entry declares (``provenance.fingerprint``), and the matrix's tolerances for it;
- the harness: its version and the hash of the code that decides results (``core/``, ``run/``,
  ``runtimes/``), so an edited harness never serves results of the old code;
- the cell: id (torch, exporter, opset, options, runtime label), export options, the runtime's
  options;
- the matrix's latency protocol and threads;
- the runtime releases the matrix asks the cell's file to be tried on (``runtime_versions``,
  ``runtime_floor``, ``deploy``), only for a runtime they name: a stored cell holds the releases
  its own run tried, so another list runs the cell again (and every other key stays as it was).

A key is known before the cell runs, but what a case imports and opens is only known after: the
record keeps every file its stages loaded (``case_files``, recorded by the worker), and a lookup
takes a stored record only while each of those files still has its recorded content
(``harness.core.files.changed_case_files``). An edited helper module, model package, config or
weights file in the repository re-runs the cell; so does a comment-only edit of any of them
(files are compared by content, not by meaning).

The runner stores a reusable record's key in the record itself (``cache_key``; crashes,
timeouts, memory kills and environment failures get none: they say nothing lasting about the
cell). Which stored record may stand for a new cell is the cache policy of
``harness.store.reuse`` (``CACHE``), over its one scan of finished runs. ``CellCache`` keeps an
index, ``reports/cache.json``, of key → the newest finished run of the store holding a record
with that key; it is rebuilt from the finished runs when missing,
unreadable or wrong (an entry that is not one, or empty while a later run finished), with a
warning (a damaged run is skipped with a warning), and a lookup checks the record it points
at, so a stale index only costs misses. ``adopt`` turns a stored record into the new run's:
un-annotated (the runner applies the current xfail list), its log and bundle linked into the new
run, ``cached_from`` naming the run that produced it and a note saying so.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from filelock import FileLock

from harness import __version__
from harness.core.env import EnvMarker, EnvSpec
from harness.core.files import changed_case_files
from harness.core.passes import matrix_releases
from harness.core.record import Record, SchemaError
from harness.core.status import Status
from harness.store.reuse import (
    CACHE,
    CHANGED,
    LASTING,
    StoredRun,
    Wanted,
    finished_runs,
    stored_run,
    warn_skipped,
)
from harness.store.runs import (
    cell_log_path,
    list_runs,
    read_run_meta,
    runs_root,
    write_json_atomic,
)

if TYPE_CHECKING:
    from harness.matrix.config import Matrix
    from harness.matrix.plan import Cell

INDEX_FILE = "cache.json"
LOCK_FILE = ".cache.lock"
INDEX_SCHEMA = 1
# Verdicts that say something lasting about the cell (the cache policy's, harness.store.reuse).
REUSABLE = LASTING
NOTE_PREFIX = "taken from run "
# What a key covers, versioned: 2 added the record's case files (keys of records that did not
# have them never match again, so such records run once more).
KEY_VERSION = 2


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class KeyContext:
    """What a run contributes to every key: harness, case sources, timing protocol, provider."""

    harness: str
    code: str | None
    cases: dict[str, str | None]
    latency: dict[str, Any]
    threads: int
    provider: str
    host: dict[str, Any] = field(default_factory=dict)
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)   # runtime name → asked

    @classmethod
    def for_run(cls, matrix: "Matrix", fingerprint: dict[str, Any] | None, provider: str) -> "KeyContext":
        fp = fingerprint or {}
        return cls(harness=str(fp.get("harness") or __version__), code=fp.get("code"),
                   cases=dict(fp.get("cases") or {}), latency=matrix.latency.to_dict(),
                   threads=matrix.threads, provider=provider, host=host_signature(),
                   releases=matrix_releases(matrix))

    def key(self, cell: "Cell", env: EnvSpec, marker: EnvMarker) -> str | None:
        """The cell's key in this environment as realised; None when it cannot be known (a case
        whose source file is not found, an environment without its installed list)."""
        case_hash = self.cases.get(cell.key.case)
        if not case_hash or not self.code or not marker.installed:
            return None
        return cell_key({
            "key_version": KEY_VERSION,
            "cell_id": cell.cell_id, "case": cell.key.case, "case_ref": cell.case_ref,
            "case_source": case_hash, "atol": cell.atol, "rtol": cell.rtol,
            "exporter": cell.key.exporter, "opset": cell.key.opset,
            "options": cell.key.options.to_dict(), "runtime": cell.key.runtime,
            "runtime_name": cell.runtime_name,
            "runtime_options": env.runtime_options.get(cell.key.runtime, {}),
            "installed": marker.identity, "python": env.python, "provider": self.provider,
            "harness": self.harness, "code": self.code,
            "latency": self.latency, "threads": self.threads,
            "host": {k: v for k, v in self.host.items() if env.needs_gpu or k != "gpu"},
            **({"releases": self.releases[cell.runtime_name]} if cell.runtime_name in self.releases else {}),
            # a pipeline's steps with their arguments and its judge (raw cells keep their keys)
            **({"steps": list(cell.steps), "judge": cell.judge} if cell.steps else {}),
        })


def host_signature() -> dict[str, Any]:
    """The hardware a result depends on beyond the packages: the CPU model (latency; OpenVINO
    picks bf16 on CPUs that have it) and, for GPU cells, the NVIDIA driver and GPU models."""
    import platform

    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu: list[str] = []
    with contextlib.suppress(OSError):
        gpu.append(Path("/proc/driver/nvidia/version").read_text(errors="replace").splitlines()[0].strip())
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            gpu += [ln.split(":", 1)[1].strip() for ln in info.read_text(errors="replace").splitlines()
                    if ln.startswith("Model:")]
    return {"machine": platform.machine(), "cpu": cpu or platform.processor(), "gpu": gpu}


def cell_key(inputs: dict[str, Any]) -> str:
    """The digest of a cell's inputs (any JSON-able mapping; key order does not matter)."""
    blob = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def reusable(rec: Record) -> bool:
    """Whether the record can enter the index: it has a key and a lasting verdict."""
    return bool(rec.cache_key) and rec.status in REUSABLE


def unannotated(rec: Record) -> Record:
    """The record as the worker made it: the known-failure marks of its run undone (only a
    failure becomes xfail, only a pass xpass), signature and hint cleared for the runner's
    annotation with the current rules."""
    if rec.status is Status.XFAIL:
        rec.status, rec.reason = Status.FAIL, None
    elif rec.status is Status.XPASS:
        rec.status, rec.reason = Status.PASS, None
    rec.signature = rec.hint = None
    return rec


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def adopt(rec: Record, source_dir: Path, run_id: str, run_dir: Path) -> Record:
    """A stored record as a record of the run ``run_id`` in ``run_dir``: un-annotated, its log and
    bundle linked (or copied) into the run, ``cached_from`` the run that first produced it."""
    origin = rec.cached_from or rec.run_id
    source_dir, run_dir = Path(source_dir), Path(run_dir)
    log = cell_log_path(source_dir, rec)
    if log is not None:
        target = run_dir / "logs" / "cached" / origin / log.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                _link_or_copy(str(log), str(target))
        rec.log = str(target)
    if rec.bundle:
        old = Path(rec.bundle)
        if not old.is_dir():
            old = source_dir / "bundles" / old.name
        new = run_dir / "bundles" / rec.cell_id
        if old.is_dir() and not new.exists():
            with contextlib.suppress(OSError):
                shutil.copytree(old, new, copy_function=_link_or_copy)
        if rec.repro:
            rec.repro = rec.repro.replace(rec.bundle, str(new))
        rec.bundle = str(new)
    rec = unannotated(rec)
    rec.notes = [n for n in rec.notes if not n.startswith(NOTE_PREFIX)]
    rec.notes.append(f"{NOTE_PREFIX}{origin}: unchanged installed packages, case source and the "
                     f"{len(rec.case_files)} file(s) the case loaded, harness, options, runtime and "
                     "latency protocol (--fresh runs it again)")
    rec.run_id, rec.cached_from = run_id, origin
    return rec


class CellCache:
    """The index of reusable records of the store's finished runs, by cell key."""

    def __init__(self, reports: Path, warn: Callable[[str], None] = _warn) -> None:
        self.reports = Path(reports)
        self.path = self.reports / INDEX_FILE
        self.warn = warn
        self._runs: dict[str, tuple[StoredRun | None, dict[str, Record]]] = {}   # read once per lookup session
        self.stale: dict[str, list[str]] = {}   # cell id → its case files changed since (last lookup)

    # -- the index --------------------------------------------------------------------------
    def _read(self, adding: Path | None = None) -> dict[str, dict[str, str]] | None:
        """The index's entries; None (with a warning saying why) when it must be rebuilt.
        ``adding``: the run about to be indexed (its finishing after the index is expected)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            self.warn(f"warning: {self.path}: unreadable ({exc}); rebuilding it from the stored runs")
            return None
        if not isinstance(data, dict) or data.get("schema") != INDEX_SCHEMA or not isinstance(data.get("keys"), dict):
            self.warn(f"warning: {self.path}: not a cell-cache index of schema {INDEX_SCHEMA}; rebuilding it")
            return None
        if why := self._wrong(data, adding):
            self.warn(f"warning: {self.path}: {why}; rebuilding it from the stored runs")
            return None
        return data["keys"]

    def _wrong(self, data: dict[str, Any], adding: Path | None = None) -> str | None:
        """What is wrong in an index that parses (None: nothing): an entry that is not one (a run
        directory outside the store, fields missing), no time of writing, or no entries although
        a run finished after it was written (an index written by hand, or from another store),
        other than ``adding``: a new store's first run finishes after its empty index."""
        updated = data.get("updated")
        if not isinstance(updated, (int, float)) or isinstance(updated, bool):
            return f"'updated' is {updated!r}, not the time it was written"
        for key, entry in data["keys"].items():
            ok = (isinstance(entry, dict) and len(key) == 32 and all(c in "0123456789abcdef" for c in key)
                  and all(isinstance(entry.get(f), str) and entry[f] for f in ("run", "dir", "cell")))
            if ok:
                rel = Path(entry["dir"])
                ok = not rel.is_absolute() and ".." not in rel.parts and rel.parts[:1] == ("runs",)
            if not ok:
                return f"entry {key[:40]!r} is not a cell key → {{run, dir, cell}} of a run in the store"
        if not data["keys"]:
            adding = Path(adding).resolve() if adding is not None else None
            for run_dir in list_runs(self.reports):
                if adding is not None and Path(run_dir).resolve() == adding:
                    continue
                try:
                    meta = read_run_meta(run_dir)
                except (SchemaError, ValueError, OSError):
                    continue
                if meta.finished and (meta.ended or 0) > updated:
                    return f"it holds no entries, yet run {run_dir.name} finished after it was written"
        return None

    def _write(self, keys: dict[str, dict[str, str]]) -> None:
        self.reports.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"schema": INDEX_SCHEMA, "updated": time.time(), "keys": keys})

    def _entries(self, run_dir: Path, records: list[Record] | None = None) -> dict[str, dict[str, str]]:
        """Key → entry for every reusable record of a finished run ({} for an unfinished one);
        raises for a damaged run. ``records``: the run's, already read and validated."""
        run = stored_run(run_dir)
        if run is None:
            return {}
        records = run.records if records is None else records
        rel = str(Path(run_dir).resolve().relative_to(self.reports.resolve()))
        return {r.cache_key: {"run": run.meta.run_id, "dir": rel, "cell": r.cell_id}
                for r in records if reusable(r)}

    def rebuild(self) -> dict[str, dict[str, str]]:
        """The index from every finished run of the store, newer runs winning; a damaged run is
        skipped with a warning."""
        keys: dict[str, dict[str, str]] = {}
        damaged = warn_skipped("cell cache", self.warn)
        rel = self.reports.resolve()
        for run in finished_runs(self.reports, damaged, newest_first=False):
            try:
                keys.update({r.cache_key: {"run": run.meta.run_id, "dir": str(run.dir.resolve().relative_to(rel)),
                                           "cell": r.cell_id} for r in run.records if reusable(r)})
            except (SchemaError, ValueError, OSError) as exc:
                damaged(run.dir, exc)
        return keys

    def index(self) -> dict[str, dict[str, str]]:
        if not self.reports.is_dir():
            return {}
        keys = self._read()
        if keys is None and list_runs(self.reports):
            with FileLock(str(self.reports / LOCK_FILE)):
                keys = self.rebuild()
                self._write(keys)
        return keys or {}

    def add_run(self, run_dir: Path, records: list[Record] | None = None) -> int:
        """Index a finished run of the store (newest wins); returns how many of its records are
        reusable. Runs outside the store (``--output`` elsewhere) are not indexed."""
        try:
            Path(run_dir).resolve().relative_to(runs_root(self.reports).resolve())
        except ValueError:
            return 0
        with FileLock(str(self.reports / LOCK_FILE)):
            keys = self._read(adding=run_dir)
            if keys is None:
                keys = self.rebuild()       # holds this run too
                mine = {k for k, e in keys.items() if (self.reports / e["dir"]).resolve() == Path(run_dir).resolve()}
            else:
                try:
                    entries = self._entries(run_dir, records)
                except (SchemaError, ValueError, OSError) as exc:
                    self.warn(f"warning: cell cache skips run {Path(run_dir).name}: {exc}")
                    entries = {}
                keys.update(entries)
                mine = set(entries)
            # Runs deleted since: their entries would only cost a failed lookup each time.
            gone = {e["dir"] for e in keys.values() if not (self.reports / e["dir"] / "run.json").exists()}
            self._write({k: e for k, e in keys.items() if e["dir"] not in gone})
        return len(mine)

    # -- lookups ----------------------------------------------------------------------------
    def lookup(self, wanted: dict[str, str], base_dir: Path | str = ".") -> dict[str, tuple[Record, Path]]:
        """For each wanted cell id → key, the stored record with that key and its run directory,
        if every file its case loaded is unchanged (relative names resolved against ``base_dir``,
        the matrix file's folder; the cells whose files changed are in ``stale``). A run that
        cannot be read is skipped with a warning (its cells run again)."""
        self.stale = {}
        if not wanted:
            return {}
        keys = self.index()
        by_dir: dict[str, dict[str, str]] = {}
        for cid, key in wanted.items():
            entry = keys.get(key)
            if entry is not None:
                by_dir.setdefault(entry["dir"], {})[cid] = key
        hits: dict[str, tuple[Record, Path]] = {}
        for rel, cells in by_dir.items():
            run_dir = self.reports / rel
            run, by_id = self._run_records(run_dir, rel)
            for cid, key in cells.items():
                rec = by_id.get(cid)
                if rec is None:
                    continue
                why = CACHE.refusal(run, rec, Wanted(base_dir=base_dir, keys={cid: key}))
                if why is None:
                    hits[cid] = (copy.copy(rec), run_dir)   # adopt rebinds fields, never mutates them
                elif why.startswith(CHANGED):
                    self.stale[cid] = changed_case_files(rec.case_files, base_dir)
        return hits

    def _run_records(self, run_dir: Path, rel: str) -> tuple[StoredRun | None, dict[str, Record]]:
        """The finished run at ``run_dir`` (None when unfinished or damaged) and its records by id."""
        if rel not in self._runs:
            try:
                run = stored_run(run_dir)
                self._runs[rel] = (run, {r.cell_id: r for r in run.records} if run else {})
            except (SchemaError, ValueError, OSError) as exc:
                warn_skipped("cell cache", self.warn)(run_dir, exc)
                self._runs[rel] = (None, {})
        return self._runs[rel]
