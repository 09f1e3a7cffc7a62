"""Run a matrix end to end: plan → environments → workers → results.jsonl + run.json.

Rendering the reports of the finished run is the caller's (``harness.report.render_run``).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import psutil
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from harness import __version__
from harness.core.job import Job
from harness.core.record import (
    Record,
    SchemaError,
    append_record,
    count_by_status,
    cut_torn_tail,
    read_records,
)
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.envs import make_provider
from harness.envs.provider import EnvironmentBuildError
from harness.matrix.config import Matrix, matrix_hash
from harness.matrix.plan import Plan
from harness.matrix.rules import ConfigError
from harness.run.annotate import Annotator
from harness.run.supervisor import (
    WorkerSupervisor,
    environment_failure_records,
    plan_needs,
    skip_records,
)
from harness.store.provenance import fingerprint
from harness.store.runs import (
    claim_new_run,
    list_runs,
    new_run_id,
    read_run_meta,
    run_dir_lock,
    update_index,
)

console = Console(stderr=True)
INTERRUPTS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM, SIGINT or SIGHUP reached the runner: its workers (and their process trees) are
    ended and the run stays unfinished, to be resumed. The CLI exits with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the block runs, the first SIGTERM/SIGINT/SIGHUP raises ``RunInterrupted`` in the main
    thread (so every ``finally`` on the way out ends its worker); later ones wait for that."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in INTERRUPTS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def end_child_processes() -> None:
    """Stop what this runner still runs (an environment being installed by the prefetch thread),
    so that it can exit now; an environment cut mid-install has no marker and is rebuilt."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def cell_memory_limit(matrix: Matrix) -> int | None:
    """``cell_memory_mb``: as set; 0 for none; unset: half of this machine's memory."""
    if matrix.cell_memory_mb is not None:
        return matrix.cell_memory_mb or None
    return psutil.virtual_memory().total // 2 // 2**20


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
                    run_id: str | None = None) -> tuple[Path, RunMeta, set[str]]:
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
    # Case sources and harness version: lets the gate reuse this run when nothing has changed.
    meta.fingerprint = fingerprint(matrix, config_path)
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


def execute(matrix: Matrix, config_path: Path, plan: Plan, output: Path | None, reports: Path,
            provider_name: str = "venv", resume: bool = False, force_resume: bool = False) -> Path:
    """Run ``plan`` into a run directory (held by this process alone) and finalize it.

    A second runner on the same directory is refused (``RunDirBusy``, with the holder's pid);
    SIGTERM/SIGINT/SIGHUP end the workers and raise ``RunInterrupted``, the run left resumable."""
    mhash = matrix_hash(matrix)
    run_id = None
    target = output
    if target is None and resume:
        target = resumable_run(reports, mhash, config_path, force_resume)
    if target is None:
        run_id, target = claim_new_run(reports, mhash)
    with interruptible(), run_dir_lock(target):
        run_dir, meta, done = prepare_run_dir(target, reports, matrix, config_path, plan, resume,
                                              force_resume, run_id)
        try:
            _execute(matrix, config_path, plan, run_dir, meta, done, provider_name)
        except RunInterrupted as exc:
            console.print(f"interrupted by {signal.Signals(exc.signum).name}: workers stopped; run "
                          f"{meta.run_id} is unfinished, resume it with --output {run_dir}",
                          markup=False, highlight=False, soft_wrap=True)
            raise
        finalize(run_dir, meta, reports)
    return run_dir


def _execute(matrix: Matrix, config_path: Path, plan: Plan, run_dir: Path, meta: RunMeta,
             done: set[str], provider_name: str) -> None:
    provider = make_provider(provider_name, log=console.print)
    (run_dir / "logs").mkdir(exist_ok=True)
    results = run_dir / "results.jsonl"
    annotate = Annotator(matrix.xfail)
    memory_mb = cell_memory_limit(matrix)
    meta.extra["limits"] = {"cell_memory_mb": memory_mb, "log_max_mb": matrix.log_max_mb}
    job = Job(run_id=meta.run_id, run_dir=str(run_dir), env="", groups=(),
              base_dir=str(config_path.resolve().parent), threads=matrix.threads, latency=matrix.latency)
    todo = plan_needs(plan, done)
    total = sum(len(cells) for _, cells in todo)
    console.print(f"run [bold]{meta.run_id}[/] → {escape(str(run_dir))}: {total} cells in "
                  f"{sum(1 for _, c in todo if c)} environments")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("cells", total=total)

        def record(rec: Record) -> None:
            rec = annotate(rec)
            append_record(results, rec)
            mark = {Status.PASS: "[green]pass[/]", Status.SKIP: "[dim]skip[/]"}.get(rec.status, f"[red]{rec.status}[/]")
            progress.console.print(f"  {mark} {escape(rec.cell_id)}" + (f"  ({rec.stage}: {escape(rec.error)})" if rec.error else ""))
            progress.advance(task)

        skip_reason = {e.env.name: provider.skip_reason(e.env) for e, cells in todo if cells}
        # Environments are prepared one ahead in a background thread: downloading and installing
        # the next torch (network and disk bound) overlaps the current worker (CPU bound).
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-prefetch")
        try:
            futures = {env_plan.env.name: pool.submit(provider.ensure, env_plan.env)
                       for env_plan, cells in todo if cells and not skip_reason[env_plan.env.name]}
            for env_plan, cells in todo:
                if not cells:
                    continue
                env = env_plan.env
                progress.update(task, description=f"{env.name}")
                if why := skip_reason[env.name]:
                    for rec in skip_records(meta.run_id, env_plan, cells, why):
                        record(rec)
                    continue
                try:
                    progress.update(task, description=f"{env.name}: preparing environment")
                    marker = futures[env.name].result()
                    meta.environments[env.name] = marker.to_dict()
                    meta.write(run_dir)
                    progress.update(task, description=f"{env.name}")
                    sup = WorkerSupervisor(provider, env_plan, job.replace(env=env.name),
                                           matrix.cell_timeout_s, record,
                                           on_event=lambda e: e.get("event") == "cell_start" and progress.update(
                                               task, description=f"{e['cell_id']}"),
                                           memory_limit_mb=memory_mb, log_max_mb=matrix.log_max_mb)
                    restarts = sup.run(cells)
                    meta.environments[env.name]["worker_restarts"] = restarts
                except EnvironmentBuildError as exc:
                    # Build logs hold brackets ("[/bin/sh -c ...]") that rich would read as markup.
                    console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
                    for rec in environment_failure_records(meta.run_id, env_plan, cells, exc):
                        record(rec)
                meta.write(run_dir)
        except BaseException:
            # Interrupted: do not wait for an environment still being installed.
            pool.shutdown(wait=False, cancel_futures=True)
            end_child_processes()
            raise
        pool.shutdown(wait=True)


def finalize(run_dir: Path, meta: RunMeta, reports: Path) -> None:
    """Mark the run finished (counts, end time) and add it to the store's index."""
    records = read_records(run_dir / "results.jsonl")
    meta.ended = time.time()
    meta.finished = True
    meta.counts = count_by_status(records)
    meta.write(run_dir)
    update_index(run_dir, reports)
