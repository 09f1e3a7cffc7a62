"""One way to reuse a stored result: one scan of the store's finished runs, named policies over it.

Four consumers ask the store "may this stored cell stand for one I would otherwise run?", each
with its own answer:

- ``CACHE`` (``harness.store.cache``): the record's ``cache_key`` is the key the new cell has (it
  covers the installed packages, the case source, the harness code, the options and the timing
  protocol), its status says something lasting (no crash, timeout or environment failure), and
  every optional pass asked of it was made (a record with ``passes_not_run`` runs again, so the
  pass is tried again).
- ``GATE`` (``harness.gate.sources``): the run's fingerprint (``harness.store.provenance``: the
  harness version and the case's source hash) is the one checked out now; any verdict but an
  environment failure counts (a crash is a result the gate compares); a passing record holds
  the runtime releases the matrix asks now (``deploy`` above all: the gate blocks on it), else
  the cell runs again.
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
Every refusal is kept (``Reused.refusals``: the run, the cell, the reason, ``fix_for`` it), so a
command can list them and one that finds nothing usable can say what it found and what to do.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from harness.core.files import changed_case_files
from harness.core.passes import releases_missing, runtime_name
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
# Why a policy refuses a stored record (each reason starts with one of these) and what to do.
ENV_FAILED = "its environment could not be built"
NOT_LASTING = "a crash or timeout says nothing lasting about the cell"
OTHER_KEY = "its cache key is not the new cell's"
OTHER_CODE = "produced by another harness version or case source"
OTHER_ENV = "ran in another environment than the one planned now"
CHANGED = "files its case loaded changed since: "
NO_FINGERPRINT = "the run has no fingerprint (it predates them), so it cannot show it is the same code"
DAMAGED_RUN = "the run cannot be read"
FIXES = {
    ENV_FAILED: "fix what the record's error names (an index, a pin); the cell runs again",
    NOT_LASTING: "nothing to fix: the cell runs again",
    OTHER_KEY: "nothing to fix: something it depends on changed (packages, case, harness, options), so it "
               "runs again",
    OTHER_CODE: "the case's source or the tool changed since: run it with this checkout "
                "(python -m harness matrix) and the result is reused from then on",
    OTHER_ENV: "a pin changed since (or an existing environment's packages did): the cell runs in the "
               "planned environment",
    CHANGED: "a file the case loaded was edited since: run the cells again (python -m harness matrix), or "
             "restore the file",
    NO_FINGERPRINT: "run the cells again with this checkout",
    DAMAGED_RUN: "repair or remove that run directory",
}


def fix_for(reason: str) -> str:
    """What to do about a refusal (by the start of its reason)."""
    return next((fix for start, fix in FIXES.items() if reason.startswith(start)), "run the cells again")


def reason_kind(reason: str) -> str:
    """A refusal's reason without its particulars (the files, the environment), to count them."""
    return next((start.rstrip(": ") for start in FIXES if reason.startswith(start)), reason)


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


def run_base_dir(run: StoredRun) -> Path:
    """The folder a stored run's relative case file names resolve against: its matrix file's
    folder as the run recorded it (``RunMeta.base_dir``); for a run from before that, the config
    path it recorded, relative to the folder its store is in (``<there>/reports/runs/<id>``)."""
    if run.meta.base_dir:
        return Path(run.meta.base_dir)
    config = Path(run.meta.config or "matrix.yaml")
    return config.parent if config.is_absolute() else (run.dir.parent.parent.parent / config).parent


@dataclass(frozen=True)
class Wanted:
    """What a new cell would be, as far as a policy asks: its key (cache), the fingerprint of the
    code checked out now (gate, bisect), its environment's name (bisect), and the folder relative
    case file names resolve against (the matrix file's; ``base_dir_of_run``: each stored run's
    own, for a command that reads a store without a matrix file, wherever it runs)."""

    fingerprint: dict[str, Any] | None = None
    base_dir: Path | str = "."
    base_dir_of_run: bool = False
    keys: dict[str, str] = field(default_factory=dict)      # cell id → cache key
    envs: dict[str, str] = field(default_factory=dict)      # cell id → environment name
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)   # runtime → releases asked


@dataclass(frozen=True)
class ReusePolicy:
    """When a stored record may stand for a new cell; ``refusal`` says why not (None: it may)."""

    name: str
    statuses: frozenset[Status] | None = None     # None: any status but an environment failure
    by_key: bool = False                          # the record's cache_key is the wanted key
    same_code: bool = False                       # the run's fingerprint matches the current one
    same_env: bool = False                        # the record ran in the planned environment
    case_files_unchanged: bool = True             # every file the case loaded is as it was
    passes_made: bool = False                     # no optional pass asked of it was left out
    releases_tried: bool = False                  # a passing record holds the releases asked now

    def refusal(self, run: StoredRun, rec: Record, wanted: Wanted) -> str | None:
        if is_environment_failure(rec):
            return ENV_FAILED
        if self.statuses is not None and rec.status not in self.statuses:
            return f"{NOT_LASTING} (a {rec.status.value})"
        if self.by_key:
            key = wanted.keys.get(rec.cell_id)
            if not rec.cache_key or rec.cache_key != key:
                return OTHER_KEY
        if self.passes_made and rec.passes_not_run:
            return f"its run could not make {', '.join(sorted(rec.passes_not_run))} for it"
        if self.releases_tried and rec.status.passed:
            runtime = runtime_name(rec.runtime)
            missing = releases_missing(rec.graph or {}, runtime, wanted.releases.get(runtime, {}))
            if missing:
                return f"its run did not try the runtime releases asked now ({'; '.join(missing.values())})"
        if self.same_code and not same_code(run.fingerprint, wanted.fingerprint, rec.case):
            return OTHER_CODE
        if self.same_env and rec.env != wanted.envs.get(rec.cell_id):
            return f"{OTHER_ENV} ({rec.env})"
        if self.case_files_unchanged:
            changed = changed_case_files(rec.case_files, run_base_dir(run) if wanted.base_dir_of_run else wanted.base_dir)
            if changed:
                return CHANGED + ", ".join(changed[:3])
        return None


CACHE = ReusePolicy("cache", statuses=LASTING, by_key=True, passes_made=True)
GATE = ReusePolicy("gate", same_code=True, same_env=True, releases_tried=True)
BISECT = ReusePolicy("bisect", same_code=True, same_env=True)
ADVISE = ReusePolicy("advise")
HISTORY = ReusePolicy("history", case_files_unchanged=False)
POLICIES = {p.name: p for p in (CACHE, GATE, BISECT, ADVISE, HISTORY)}


@dataclass(frozen=True)
class Refusal:
    """A stored record a policy did not take (``cell`` None: a whole run it could not use)."""

    run: str
    cell: str | None
    case: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "cell": self.cell, "reason": self.reason, "fix": fix_for(self.reason)}


@dataclass
class Reused:
    """The newest acceptable stored record per cell, the run each came from, and every stored
    record (or run) the policy refused, with why."""

    records: dict[str, Record] = field(default_factory=dict)        # cell id → record
    runs: dict[str, StoredRun] = field(default_factory=dict)        # cell id → its run
    refused: dict[str, str] = field(default_factory=dict)           # cell id → why (newest refused)
    refusals: list[Refusal] = field(default_factory=list)           # every refusal, newest run first
    scanned: int = 0                                                # finished runs looked at

    def fingerprints(self) -> dict[str, dict[str, Any]]:
        """Run id → fingerprint of the runs the records came from."""
        return {r.meta.run_id: r.fingerprint or {} for r in self.runs.values()}

    def explain(self, case: str | None = None) -> list[str]:
        """What was found and why it was refused, one line per reason with its count and fix
        (``case``: only that case's records); empty when nothing was refused."""
        mine = [r for r in self.refusals if case is None or r.cell is None or r.case == case]
        kinds: dict[str, list[Refusal]] = {}
        for r in mine:
            kinds.setdefault(reason_kind(r.reason), []).append(r)
        out = []
        for kind, group in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            runs = sorted({r.run for r in group})
            what = (f"{len(runs)} run(s)" if group[0].cell is None
                    else f"{len(group)} record(s) of {len(runs)} run(s)")
            out.append(f"{what} refused: {kind} ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}); "
                       f"fix: {fix_for(group[0].reason)}")
        return out


def reuse(policy: ReusePolicy, reports: Path, wanted: Wanted = Wanted(),
          cells: Iterable[str] | None = None, damaged: Damaged | None = None,
          runs: Iterable[StoredRun] | None = None) -> Reused:
    """For each cell id in ``cells`` (every cell when None) the newest record of the store's
    finished runs (or of ``runs``) that ``policy`` accepts; a damaged run goes to ``damaged``.
    Every refusal (a record, or a run the policy cannot use) is kept with its reason."""
    want = None if cells is None else set(cells)
    report = damaged or warn_skipped(f"{policy.name} reuse")
    out = Reused()

    def damaged_run(run_dir: Path, exc: Exception) -> None:
        out.refusals.append(Refusal(Path(run_dir).name, None, None, f"{DAMAGED_RUN}: {exc}"))
        report(run_dir, exc)

    source = runs if runs is not None else finished_runs(reports, damaged_run)
    for run in source:
        out.scanned += 1
        if policy.same_code and not run.fingerprint:
            out.refusals.append(Refusal(run.meta.run_id, None, None, NO_FINGERPRINT))
            continue
        try:
            records = run.records
        except DAMAGED as exc:
            damaged_run(run.dir, exc)
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
                out.refusals.append(Refusal(run.meta.run_id, cid, rec.case, why))
        if want is not None and len(out.records) == len(want):
            break
    return out


def nothing_usable(policy: ReusePolicy, reports: Path, wanted: Wanted = Wanted(), case: str | None = None) -> str:
    """For a command that found nothing usable: what the store holds (of ``case``) and why the
    policy refused it, with the fix, as one sentence."""
    found = reuse(policy, reports, wanted, damaged=lambda d, exc: None)
    lines = found.explain(case)
    held = f"{found.scanned} finished run(s) in {reports}"
    if not lines:
        return f"found {held}, none holding {'case ' + repr(case) if case else 'a record'}"
    return f"found {held}; " + "; ".join(lines)
