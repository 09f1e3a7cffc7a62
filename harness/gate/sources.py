"""Where the gate's two sides come from: a run (id or directory, optionally `@torch`) or a torch
version, whose cells are taken from stored finished runs with the same code and run where missing.

Stored results are reused by the gate's policy (``harness.store.reuse.GATE``): only when the
case source file and the harness version that produced them are the ones checked out now (the
fingerprint), and every file the case loaded when it ran (the record's ``case_files``) is
unchanged, so a gate never compares different cases.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.env import ExistingEnv
from harness.core.passes import matrix_releases
from harness.core.record import Record
from harness.matrix.config import Matrix
from harness.matrix.plan import Plan, build_plan
from harness.matrix.rules import ConfigError
from harness.store.provenance import FINGERPRINT_FILE, run_fingerprint
from harness.store.reuse import GATE, Refusal, Reused, ReusePolicy, Wanted, is_environment_failure, reuse
from harness.store.runs import load_run, resolve_run, write_json_atomic

_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$")


@dataclass
class Side:
    """One side of the comparison: its records (one torch version) and where they came from."""
    label: str                 # what the user passed
    torch: str
    records: list[Record]
    runs: list[str] = field(default_factory=list)            # run ids the records came from
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)   # run id → fingerprint
    executed: list[str] = field(default_factory=list)        # runs the gate started for this side
    subject: str = ""          # what moved, when not torch: "onnxscript 0.5.0" (gate --package)
    refused: list[Refusal] = field(default_factory=list)     # stored records not reused, with why
    environment: ExistingEnv | None = None   # an existing environment (gate --baseline-env/--candidate-env)

    @property
    def title(self) -> str:
        return self.subject or f"torch {self.torch}"


def version_plan(matrix: Matrix, version: str) -> tuple[Matrix, Plan]:
    restricted = matrix.one_release(version)
    return restricted, build_plan(restricted, {"torch": [version]})


def is_version(ref: str) -> bool:
    return bool(_VERSION.match(ref))


def side_from_run(ref: str, reports: Path) -> Side:
    """A run given by id or directory; `RUN@2.13.0` picks one torch version of a multi-version run."""
    run_ref, _, version = ref.rpartition("@") if "@" in ref else (ref, "", "")
    run_dir = resolve_run(run_ref, reports)
    meta, records = load_run(run_dir)
    if not records:
        state = "" if meta.finished else ", and is not finished"
        raise ConfigError(f"run {meta.run_id} ({run_dir}) has no records{state}: nothing to compare; "
                          "expected a run that holds results")
    if not meta.finished:
        raise ConfigError(f"run {meta.run_id} is not finished (still being written, or interrupted: "
                          "finish it with --resume): the gate compares finished runs only")
    versions = sorted({r.torch for r in records})
    if version:
        if version not in versions:
            raise ConfigError(f"run {meta.run_id} has no torch {version} (it has {versions})")
    elif len(versions) != 1:
        raise ConfigError(f"run {meta.run_id} holds torch {versions}: pick one as "
                          f"'{run_ref}@{versions[-1] if versions else 'VERSION'}'")
    else:
        version = versions[0]
    chosen = [r for r in records if r.torch == version]
    return Side(ref, version, chosen, [meta.run_id], {meta.run_id: run_fingerprint(run_dir, meta) or {}})


class EnvironmentFailure(ConfigError):
    """A side's environment could not be built: the gate cannot compare (exit 2, never 1)."""


def environment_problem(side: Side, which: str) -> str | None:
    """What keeps ``side`` from being compared because an environment could not be built."""
    failed = [r for r in side.records if is_environment_failure(r)]
    if not failed:
        return None
    envs = sorted({r.env for r in failed})
    return (f"{which} {side.label}: environment {', '.join(envs)} could not be built, so "
            f"{len(failed)} cell(s) have no result: {' '.join((failed[0].error or '').split())[:300]}")


def check_environments(sides: dict[str, Side]) -> None:
    """Raise EnvironmentFailure (one line, naming every failed environment) if any side has one."""
    problems = [p for which, side in sides.items() if (p := environment_problem(side, f"--{which}"))]
    if problems:
        raise EnvironmentFailure("; ".join(problems) + " (nothing was compared; such records are never "
                                 "reused: fix the environment and run the gate again)")


def stored_records(plan: Plan, current: dict[str, Any], reports: Path,
                   base_dir: Path | str = ".", policy: ReusePolicy = GATE,
                   envs: dict[str, str] | None = None) -> tuple[list[Record], dict[str, dict], Reused]:
    """Newest finished result per planned cell that ``policy`` (``harness.store.reuse``) lets stand
    for it: by default the gate's (same code, case files unchanged, relative names resolved against
    ``base_dir``, the matrix file's folder; no environment failure: those cells run again)."""
    # A stored cell stands for a planned one only if it ran in the same environment (its name
    # hashes every package installed): a cell of another companion pin is another cell.
    if envs is None:
        envs = {c.cell_id: e.env.name for e in plan.environments for c in e.cells}
    wanted = Wanted(fingerprint=current, base_dir=base_dir, envs=envs, releases=matrix_releases(plan.matrix))
    # One damaged run must not block every later gate: its cells are run again instead.
    found = reuse(policy, reports, wanted, [c.cell_id for c in plan.cells],
                  damaged=lambda d, exc: print(f"warning: skipping stored run {d.name}: {exc}", file=sys.stderr))
    prints = {rec.run_id: found.runs[cid].fingerprint or {} for cid, rec in found.records.items()}
    return list(found.records.values()), prints, found


def say_refusals(label: str, found: Reused, planned: int) -> None:
    """One line on what the store held for a side and, where it could not stand for a planned
    cell, a line per reason with its count and fix (every refusal is in gate.json)."""
    from harness.console import console

    if not found.refusals:
        return
    console.print(f"{label}: {len(found.records)} of {planned} cell(s) from {found.scanned} stored run(s); "
                  "not reused:", markup=False, highlight=False)
    for line in found.explain():
        console.print(f"  {line}", markup=False, highlight=False)


def run_cells(matrix: Matrix, config_path: Path, plan: Plan, output: Path | None, reports: Path,
              provider: str, current: dict[str, Any], keep_spool: bool = False) -> Path:
    """Run a (pruned) plan through the normal executor, then record the code that produced it;
    ``keep_spool``: keep the exported files (``RunRequest.keep_spool``)."""
    from harness.run.context import RunRequest
    from harness.run_workflow import run_plan

    run_dir = run_plan(RunRequest(matrix, config_path, plan, reports, output, provider, keep_spool=keep_spool))
    write_json_atomic(Path(run_dir) / FINGERPRINT_FILE, current)
    return Path(run_dir)


@dataclass
class PendingSide:
    """A side given as a torch version: the cells found in the store, and those still to run."""
    side: Side
    matrix: Matrix            # the matrix restricted to this torch version
    missing: Plan             # the cells no stored run has


def plan_version_side(version: str, matrix: Matrix, config_path: Path, reports: Path,
                      current: dict[str, Any]) -> PendingSide:
    """Stored cells of a version side, and the plan of the missing ones (nothing runs here)."""
    restricted, plan = version_plan(matrix, version)
    if not plan.cells:
        raise ConfigError(f"{config_path}: no cells for torch {version} (check exclude/include)")
    records, prints, found = stored_records(plan, current, reports, config_path.resolve().parent)
    say_refusals(f"torch {version}", found, len(plan.cells))
    side = Side(version, version, records, sorted(prints), prints, refused=found.refusals)
    missing = {c.cell_id for c in plan.cells} - {r.cell_id for r in records}
    return PendingSide(side, restricted, plan.restricted(missing))


def complete_side(pending: PendingSide, config_path: Path, reports: Path, provider: str,
                  current: dict[str, Any]) -> Side:
    """Run a version side's missing cells (stored for the next gate); return the whole side."""
    side, plan = pending.side, pending.missing
    if plan.cells:
        missing = {c.cell_id for c in plan.cells}
        run_dir = run_cells(pending.matrix, config_path, plan, None, reports, provider, current)
        meta, new = load_run(run_dir)
        side.records += [r for r in new if r.cell_id in missing]
        side.runs.append(meta.run_id)
        side.fingerprints[meta.run_id] = current
        side.executed.append(meta.run_id)
    return side


def same_side(a: Side | None, b: Side | None, ref_a: str, ref_b: str) -> bool:
    """Both references name the same thing: one torch version, or one run's one version."""
    if a is None and b is None:
        return _same_version(ref_a, ref_b)
    if a is not None and b is not None:
        return a.runs == b.runs and a.torch == b.torch
    return False


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def run_side_or_none(ref: str, reports: Path) -> Side | None:
    """The side for a run reference; None for a torch version; ConfigError for neither.

    Called for both references before anything runs, so a typo never starts a long matrix run.
    """
    if "@" not in ref and is_version(ref) and not (Path(ref) / "run.json").exists():
        return None
    try:
        return side_from_run(ref, reports)
    except FileNotFoundError:
        raise ConfigError(f"{ref!r} is neither a torch version (e.g. 2.13.0) nor a stored run "
                          f"(id, directory or RUN@VERSION under {reports})") from None
