"""One way to reuse a stored result: one scan of the store's finished runs, named policies over it.

Four consumers ask the store "may this stored cell stand for one I would otherwise run?", each
with its own answer:

- ``CACHE`` (``harness.store.cache``): the record's ``cache_key`` is the key the new cell has (it
  covers the installed packages, the case source, the harness code, the options and the timing
  protocol), and its status says something lasting (no crash, timeout or environment failure).
- ``GATE`` (``harness.gate.sources``): the run's fingerprint (``harness.store.provenance``: the
  harness version and the case's source hash) is the one checked out now; any verdict but an
  environment failure counts (a crash is a result the gate compares).
- ``BISECT`` (``harness.gate.bisect``): the gate's rule, and the record ran in the very
  environment planned now (its name hashes every pin): a release retried after a companion pin
  changed runs again.
- ``ADVISE`` (``harness.report.advise``): any finished record but an environment failure, of
  any harness version: a recommendation reads what was measured.
- ``HISTORY``: every finished record but an environment failure, whatever changed since: the
  history is what happened; records whose case files changed since are kept (a history
  that dropped them could not show the night a changed case flipped).

Every policy but ``HISTORY`` refuses a record one of whose case files (``Record.case_files``:
every file its case loaded) has changed since it ran. Unfinished runs are never read (the scan
yields finished runs only), and a damaged run is skipped with a warning (its cells run again).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from harness.core.files import changed_case_files
from harness.core.record import Record, SchemaError
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.envs.provider import EnvironmentBuildError
from harness.store.provenance import run_fingerprint, same_code
from harness.store.runs import list_runs, load_run, read_run_meta

# Verdicts that say something lasting about the cell; crash and timeout (memory kills and
# environment failures are crashes) and error (the matrix's own code failed) are never taken by
# the cache.
LASTING = frozenset({Status.PASS, Status.FAIL, Status.SKIP, Status.XFAIL, Status.XPASS})
DAMAGED = (SchemaError, ValueError, OSError)
CHANGED = "files its case loaded changed since: "


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def is_environment_failure(rec: Record) -> bool:
    """A record the runner wrote because the cell's environment could not be built or started:
    it says nothing about the cell, so no policy reuses it."""
    return rec.status is Status.CRASH and (rec.error or "").startswith(EnvironmentBuildError.__name__)


@dataclass
class StoredRun:
    """A finished run of the store: its directory, metadata and fingerprint; records read once."""

    dir: Path
    meta: RunMeta
    fingerprint: dict[str, Any] | None
    _records: list[Record] | None = field(default=None, repr=False)

    @property
    def records(self) -> list[Record]:
        if self._records is None:
            self._records = load_run(self.dir)[1]
        return self._records


def stored_run(run_dir: Path) -> StoredRun | None:
    """The run at ``run_dir`` if it is finished (None otherwise); raises for a damaged one."""
    meta = read_run_meta(run_dir)
    if not meta.finished:
        return None
    return StoredRun(Path(run_dir), meta, run_fingerprint(run_dir, meta))


Damaged = Callable[[Path, Exception], None]


def warn_skipped(who: str, warn: Callable[[str], None] = _warn) -> Damaged:
    """How a damaged run is reported: one warning line naming who skips it and why."""
    return lambda run_dir, exc: warn(f"warning: {who} skips stored run {Path(run_dir).name}: {exc}")


def finished_runs(reports: Path, damaged: Damaged | None = None,
                  newest_first: bool = True) -> Iterator[StoredRun]:
    """The store's finished runs (newest first by default); a run whose metadata or fingerprint
    cannot be read is skipped and handed to ``damaged`` (default: a warning)."""
    damaged = damaged or warn_skipped("the store scan")
    dirs = list_runs(reports)
    for run_dir in (reversed(dirs) if newest_first else dirs):
        try:
            run = stored_run(run_dir)
        except DAMAGED as exc:
            damaged(run_dir, exc)
            continue
        if run is not None:
            yield run


@dataclass(frozen=True)
class Wanted:
    """What a new cell would be, as far as a policy asks: its key (cache), the fingerprint of the
    code checked out now (gate, bisect), its environment's name (bisect), and the folder relative
    case file names resolve against (the matrix file's)."""

    fingerprint: dict[str, Any] | None = None
    base_dir: Path | str = "."
    keys: dict[str, str] = field(default_factory=dict)      # cell id → cache key
    envs: dict[str, str] = field(default_factory=dict)      # cell id → environment name


@dataclass(frozen=True)
class ReusePolicy:
    """When a stored record may stand for a new cell; ``refusal`` says why not (None: it may)."""

    name: str
    statuses: frozenset[Status] | None = None     # None: any status but an environment failure
    by_key: bool = False                          # the record's cache_key is the wanted key
    same_code: bool = False                       # the run's fingerprint matches the current one
    same_env: bool = False                        # the record ran in the planned environment
    case_files_unchanged: bool = True             # every file the case loaded is as it was

    def refusal(self, run: StoredRun, rec: Record, wanted: Wanted) -> str | None:
        if is_environment_failure(rec):
            return "its environment could not be built"
        if self.statuses is not None and rec.status not in self.statuses:
            return f"a {rec.status.value} says nothing lasting about the cell"
        if self.by_key:
            key = wanted.keys.get(rec.cell_id)
            if not rec.cache_key or rec.cache_key != key:
                return "its cache key is not the new cell's"
        if self.same_code and not same_code(run.fingerprint, wanted.fingerprint, rec.case):
            return "produced by another harness version or case source"
        if self.same_env and rec.env != wanted.envs.get(rec.cell_id):
            return f"ran in environment {rec.env}, not the one planned now"
        if self.case_files_unchanged:
            changed = changed_case_files(rec.case_files, wanted.base_dir)
            if changed:
                return CHANGED + ", ".join(changed[:3])
        return None


CACHE = ReusePolicy("cache", statuses=LASTING, by_key=True)
GATE = ReusePolicy("gate", same_code=True, same_env=True)
BISECT = ReusePolicy("bisect", same_code=True, same_env=True)
ADVISE = ReusePolicy("advise")
HISTORY = ReusePolicy("history", case_files_unchanged=False)
POLICIES = {p.name: p for p in (CACHE, GATE, BISECT, ADVISE, HISTORY)}


@dataclass
class Reused:
    """The newest acceptable stored record per cell, the run each came from, and why the newest
    stored record of the other cells was refused."""

    records: dict[str, Record] = field(default_factory=dict)        # cell id → record
    runs: dict[str, StoredRun] = field(default_factory=dict)        # cell id → its run
    refused: dict[str, str] = field(default_factory=dict)           # cell id → why (newest refused)

    def fingerprints(self) -> dict[str, dict[str, Any]]:
        """Run id → fingerprint of the runs the records came from."""
        return {r.meta.run_id: r.fingerprint or {} for r in self.runs.values()}


def reuse(policy: ReusePolicy, reports: Path, wanted: Wanted = Wanted(),
          cells: Iterable[str] | None = None, damaged: Damaged | None = None,
          runs: Iterable[StoredRun] | None = None) -> Reused:
    """For each cell id in ``cells`` (every cell when None) the newest record of the store's
    finished runs (or of ``runs``) that ``policy`` accepts; a damaged run goes to ``damaged``."""
    want = None if cells is None else set(cells)
    damaged = damaged or warn_skipped(f"{policy.name} reuse")
    out = Reused()
    source = runs if runs is not None else finished_runs(reports, damaged)
    for run in source:
        if policy.same_code and not run.fingerprint:
            continue            # a run without a fingerprint cannot show it is the same code
        try:
            records = run.records
        except DAMAGED as exc:
            damaged(run.dir, exc)
            continue
        for rec in records:
            cid = rec.cell_id
            if cid in out.records or (want is not None and cid not in want):
                continue
            why = policy.refusal(run, rec, wanted)
            if why is None:
                out.records[cid], out.runs[cid] = rec, run
                out.refused.pop(cid, None)
            else:
                out.refused.setdefault(cid, why)
        if want is not None and len(out.records) == len(want):
            break
    return out
