"""A run directory's lifecycle: claimed (or reopened to resume), held, finished or removed.

``held_run`` is the whole of it for the run core: it claims a new run directory in the store (or
reopens an unfinished one), holds its lock, writes run.json with everything known up front, and
either finalizes the run (counts, end time, index, cell cache: after that run.json is immutable)
or, when the run failed before recording any cell, removes what it added.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from harness import __version__
from harness.console import console
from harness.core.passes import gather
from harness.core.record import SchemaError, count_by_status, cut_torn_tail, read_records
from harness.core.run import RunMeta
from harness.matrix.config import Matrix, matrix_hash
from harness.matrix.plan import Plan
from harness.matrix.rules import ConfigError
from harness.store.cache import CellCache
from harness.store.provenance import fingerprint
from harness.store.reductions import read_reductions
from harness.store.runs import (
    claim_new_run,
    list_runs,
    new_run_id,
    read_run_meta,
    run_dir_lock,
    update_index,
)


@dataclass
class HeldRun:
    """A run directory this process holds: its metadata and the cells already recorded."""

    run_dir: Path
    meta: RunMeta
    done: set[str]


@contextlib.contextmanager
def held_run(reports: Path, matrix: Matrix, config_path: Path, plan: Plan, output: Path | None = None,
             resume: bool = False, force_resume: bool = False,
             meta_extra: Mapping[str, Any] | None = None) -> Iterator[HeldRun]:
    """Hold a new or resumed run directory for the block, and finalize it when the block ends
    normally (the results in the plan's order). A run this process started that fails before its
    first record is removed; an interrupted one (``KeyboardInterrupt``) stays, to be resumed."""
    mhash = matrix_hash(matrix)
    run_id = None
    target = output
    if target is None and resume:
        target = resumable_run(reports, mhash, config_path, force_resume)
    if target is None:
        run_id, target = claim_new_run(reports, mhash)
    target = Path(target)
    # What the folder held before this run (None: no folder, or one claimed just now in the
    # store; False: a run already there): a run that fails before its first record removes
    # only what it added.
    if run_id is not None or not target.is_dir():
        before: set[str] | None | bool = None
    elif (target / "run.json").exists():
        before = False
    else:
        before = {p.name for p in target.iterdir()}
    held = False
    try:
        with run_dir_lock(target):
            held = True
            run_dir, meta, done = prepare_run_dir(target, reports, matrix, config_path, plan, resume,
                                                  force_resume, run_id, meta_extra)
            yield HeldRun(run_dir, meta, done)
            finalize(run_dir, meta, reports, order=[c.cell_id for c in plan.cells])
    except Exception:
        if before is not False and held:
            drop_if_empty(target, before)   # after the lock is given back: nobody holds it now
        raise


def resumable_run(reports: Path, mhash: str, config_path: Path, force: bool) -> Path | None:
    """What ``--resume`` continues: the newest unfinished run of this matrix (same matrix hash).
    None when no run is unfinished; when only runs of other matrices are, ConfigError (unless
    ``force``: then the newest of them)."""
    unfinished: list[tuple[Path, RunMeta]] = []
    for path in list_runs(reports):
        try:
            meta = read_run_meta(path)
        except SchemaError as exc:
            console.print(f"warning: --resume skips {path}: {exc}", markup=False, highlight=False, soft_wrap=True)
            continue
        if not meta.finished:
            unfinished.append((path, meta))
    same = [path for path, meta in unfinished if meta.matrix_hash == mhash]
    if same or not unfinished:
        return same[-1] if same else None
    path, meta = unfinished[-1]
    if force:
        return path
    raise ConfigError(
        f"--resume: the newest unfinished run {path} was started from matrix {meta.matrix_hash} "
        f"({meta.config}), but {config_path} is matrix {mhash}: resuming would mix two matrices. "
        "Resume it with its own config, drop --resume to start a new run, or pass --force-resume "
        "to continue it with this config")


def prepare_run_dir(output: Path | None, reports: Path, matrix: Matrix, config_path: Path,
                    plan: Plan, resume: bool, force_resume: bool = False,
                    run_id: str | None = None,
                    meta_extra: Mapping[str, Any] | None = None) -> tuple[Path, RunMeta, set[str]]:
    """Create a new run directory, or reopen an unfinished one to resume it (the caller holds
    its lock): a finished run, a run of another matrix (unless ``force_resume``) and a results
    file with a bad line are refused; a torn last line is cut and reported."""
    mhash = matrix_hash(matrix)
    if output is None and resume:
        output = resumable_run(reports, mhash, config_path, force_resume)
    if output is not None and (output / "run.json").exists():
        meta = read_run_meta(output)
        if meta.finished:
            raise ConfigError(f"{output} holds a finished run ({meta.run_id}); finished runs are "
                              "immutable: choose another --output")
        if meta.matrix_hash != mhash:
            if not force_resume:
                raise ConfigError(
                    f"{output}: this run was started from matrix {meta.matrix_hash} ({meta.config}), "
                    f"but {config_path} is matrix {mhash}: resuming would mix two matrices. Choose "
                    "another --output, or pass --force-resume to continue this run with "
                    f"{config_path}")
            force_matrix(meta, matrix, config_path, mhash)
        results = output / "results.jsonl"
        cut_torn_tail(results, warn=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True))
        try:
            records = read_records(results)
        except SchemaError as exc:
            raise ConfigError(f"cannot resume {output}: {exc}. Repair or delete that line (a cell "
                              "without its record is run again), or start a new run") from None
        done = {r.cell_id for r in records}
        meta.resumed.append(time.time())
        meta.write(output)
        console.print(f"resuming {meta.run_id}: {len(done)} cells already recorded",
                      markup=False, highlight=False, soft_wrap=True)
        return output, meta, done
    run_id = run_id or new_run_id(mhash)
    run_dir = output or reports / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    summary = {"cells": len(plan.cells), "environments": [e.env.to_dict() for e in plan.environments]}
    meta = RunMeta.start(run_id, __version__, config_path, mhash, summary)
    meta.base_dir = str(config_path.resolve().parent)   # where the records' case file names resolve
    # Case sources and harness version: lets the gate reuse this run when nothing has changed.
    meta.fingerprint = fingerprint(matrix, config_path)
    meta.extra.update(meta_extra or {})      # known up front: a finished run.json is never rewritten
    meta.write(run_dir)
    return run_dir, meta, set()


def force_matrix(meta: RunMeta, matrix: Matrix, config_path: Path, mhash: str) -> None:
    """--force-resume: the run goes on with another matrix. run.json says so; cases whose source
    differs between the two get no fingerprint, so the gate never reuses their cells."""
    meta.extra.setdefault("forced_resumes", []).append(
        {"at": time.time(), "matrix_hash": mhash, "previous_matrix_hash": meta.matrix_hash,
         "config": str(config_path), "previous_config": meta.config})
    console.print(f"warning: --force-resume: continuing run {meta.run_id} (matrix {meta.matrix_hash}) "
                  f"with {config_path} (matrix {mhash})", markup=False, highlight=False, soft_wrap=True)
    meta.matrix_hash, meta.config = mhash, str(config_path)
    new, old = fingerprint(matrix, config_path), meta.fingerprint
    if isinstance(old, dict) and old.get("harness") == new.get("harness"):
        cases = dict(old.get("cases") or {})
        for case, digest in new["cases"].items():
            cases[case] = digest if cases.get(case, digest) == digest else None
        meta.fingerprint = {**new, "cases": cases}
    else:
        meta.fingerprint = None


def drop_if_empty(run_dir: Path, before: set[str] | None) -> None:
    """A run this process started that failed before recording any cell is removed (what it
    added to the folder; the folder too when it made it): an empty unfinished run would only
    stand in the store as a side no gate or report can use."""
    results = run_dir / "results.jsonl"
    if results.exists() and results.stat().st_size:
        return
    if before is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for path in list(run_dir.iterdir()) if run_dir.is_dir() else []:
        if path.name not in before:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def finalize(run_dir: Path, meta: RunMeta, reports: Path, order: list[str] | None = None,
             ended: float | None = None) -> None:
    """Mark the run finished (counts, end time) and add it to the store's index and cell cache.

    Records are appended as cells finish, so while a run goes on results.jsonl is in completion
    order (workers run in parallel); with ``order`` (the plan's cell ids) a finished file that
    holds exactly those cells is rewritten in that order, so it does not depend on scheduling
    (a run resumed with another filter keeps the order its records were appended in). ``ended``:
    when the run ended, if not now (a merged run: its last shard's end)."""
    results = run_dir / "results.jsonl"
    records = read_records(results)
    if order and sorted(order) == sorted(r.cell_id for r in records):
        sort_results(results, order)
    meta.ended = ended or time.time()
    meta.finished = True
    meta.counts = count_by_status(records)
    # Every optional pass that could not be made, from the records and the reductions: said in
    # run.json before it becomes immutable (a run whose passes all ran writes nothing here).
    meta.passes_not_run = [g.to_dict() for g in gather(records, read_reductions(run_dir))] or None
    meta.write(run_dir)
    update_index(run_dir, reports)
    try:
        CellCache(reports, warn=_say).add_run(run_dir, records)
    except OSError as exc:
        _say(f"warning: the cell cache could not index {run_dir}: {exc}")


def sort_results(path: Path, order: list[str]) -> None:
    """Rewrite a (validated) results file with its lines in ``order`` of cell ids, atomically."""
    rank = {cid: i for i, cid in enumerate(order)}
    lines = [ln for ln in path.read_bytes().splitlines(keepends=True) if ln.strip()]
    ranked = sorted(enumerate(lines), key=lambda il: (rank.get(json.loads(il[1]).get("cell_id"), len(rank)), il[0]))
    if [i for i, _ in ranked] == list(range(len(lines))):
        return
    tmp = path.with_name(path.name + ".sorted")
    with open(tmp, "wb") as fh:
        fh.writelines(line for _, line in ranked)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _say(message: str) -> None:
    console.print(message, markup=False, highlight=False, soft_wrap=True)
