"""Run a matrix end to end: plan → environments → workers → results.jsonl + run.json.

Verdicts run in parallel, latency alone after them (``Scheduler``); unchanged cells come from the
store (``harness.store.cache``). Rendering the reports of the finished run is the caller's
(``harness.report.render_run``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness import __version__
from harness.console import console
from harness.core.job import PHASE_LATENCY, PHASE_VERDICTS, SPOOL_DIR, Job
from harness.core.record import (
    Record,
    SchemaError,
    append_records,
    count_by_status,
    cut_torn_tail,
    read_records,
)
from harness.core.run import RunMeta
from harness.core.status import Stage, Status
from harness.envs import make_provider
from harness.envs.provider import EnvironmentBuildError, Provider, cannot_create
from harness.matrix.config import Matrix, matrix_hash
from harness.matrix.plan import Cell, EnvPlan, Plan
from harness.matrix.rules import ConfigError
from harness.run.annotate import Annotator
from harness.run.floors import RuntimeAxes, annotate_run
from harness.run.supervisor import (
    EnvWork,
    Stopped,
    WorkerSupervisor,
    environment_failure_records,
    plan_needs,
    planned_record,
    skip_records,
)
from harness.store.cache import CellCache, KeyContext, adopt
from harness.store.provenance import fingerprint
from harness.store.runs import (
    claim_new_run,
    list_runs,
    new_run_id,
    read_run_meta,
    run_dir_lock,
    update_index,
)

# --fresh: None takes unchanged cells from the store; "latency": all but passing ones (those run
# again, for a fresh timing); "all": every cell runs.
FRESH_ALL, FRESH_LATENCY = "all", "latency"
FRESH_MODES = (None, FRESH_LATENCY, FRESH_ALL)
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


def cell_memory_limit(matrix: Matrix, jobs: int = 1) -> int | None:
    """``cell_memory_mb``: as set; 0 for none; unset: half of this machine's memory, shared by
    the ``jobs`` workers that may run at once."""
    if matrix.cell_memory_mb is not None:
        return matrix.cell_memory_mb or None
    return psutil.virtual_memory().total // 2 // max(1, jobs) // 2**20


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
            provider_name: "str | Provider" = "venv", resume: bool = False, force_resume: bool = False,
            jobs: int | None = None, fresh: str | None = FRESH_ALL, verbose: bool = False) -> Path:
    """Run ``plan`` into a run directory (held by this process alone) and finalize it.

    ``jobs``: verdict workers at once (None: the matrix's ``jobs``, else one per core); latency is
    timed after them, alone. ``fresh``: None takes unchanged cells from the store (the cell
    cache), ``"latency"`` too but runs cached passing cells again (fresh timings), ``"all"`` (the
    default here: the gate's re-measurements must never be served from the store) runs every cell.

    A second runner on the same directory is refused (``RunDirBusy``, with the holder's pid);
    SIGTERM/SIGINT/SIGHUP end the workers and raise ``RunInterrupted``, the run left resumable.
    Finished cells are printed one line each as they land: on a terminal only failures (the
    progress bar, with its estimate of the time left, counts the rest), elsewhere (CI logs) every
    cell but skips; ``verbose``: every cell."""
    if fresh not in FRESH_MODES:
        raise ConfigError(f"--fresh: expected one of {', '.join(m for m in FRESH_MODES if m)} (got {fresh!r})")
    jobs = resolve_jobs(jobs, matrix)
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
        with interruptible(), run_dir_lock(target):
            held = True
            run_dir, meta, done = prepare_run_dir(target, reports, matrix, config_path, plan, resume,
                                                  force_resume, run_id)
            try:
                _execute(matrix, config_path, plan, run_dir, meta, done, provider_name, reports, jobs, fresh,
                         verbose)
            except RunInterrupted as exc:
                console.print(f"interrupted by {signal.Signals(exc.signum).name}: workers stopped; run "
                              f"{meta.run_id} is unfinished, resume it with --output {run_dir}",
                              markup=False, highlight=False, soft_wrap=True)
                raise
            finalize(run_dir, meta, reports, order=[c.cell_id for c in plan.cells])
    except Exception:
        if before is not False and held:
            _drop_if_empty(target, before)   # after the lock is given back: nobody holds it now
        raise
    return run_dir


def _drop_if_empty(run_dir: Path, before: set[str] | None) -> None:
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


def resolve_jobs(jobs: int | None, matrix: Matrix) -> int:
    """``--jobs``, else the matrix's ``jobs``, else the cores this process may run on."""
    if jobs is not None:
        if jobs < 1:
            raise ConfigError(f"--jobs: expected a number of workers >= 1 (got {jobs})")
        return jobs
    if matrix.jobs:
        return matrix.jobs
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _execute(matrix: Matrix, config_path: Path, plan: Plan, run_dir: Path, meta: RunMeta,
             done: set[str], provider_name: "str | Provider", reports: Path, jobs: int,
             fresh: str | None, verbose: bool = False) -> None:
    provider = make_provider(provider_name, log=console.print) if isinstance(provider_name, str) else provider_name
    (run_dir / "logs").mkdir(exist_ok=True)
    # A spool left by an interrupted run belongs to verdicts that were never written: they run again.
    shutil.rmtree(run_dir / SPOOL_DIR, ignore_errors=True)
    memory_mb = cell_memory_limit(matrix, jobs)
    meta.extra["limits"] = {"cell_memory_mb": memory_mb, "log_max_mb": matrix.log_max_mb}
    job = Job(run_id=meta.run_id, run_dir=str(run_dir), env="", groups=(),
              base_dir=str(config_path.resolve().parent), threads=matrix.threads, latency=matrix.latency,
              phase=PHASE_VERDICTS, determinism=matrix.determinism,
              keep_spool=bool(RuntimeAxes.from_matrix(matrix)))
    todo = [(e, cells) for e, cells in plan_needs(plan, done) if cells]
    total = sum(len(cells) for _, cells in todo)
    console.print(f"run [bold]{meta.run_id}[/] → {escape(str(run_dir))}: {total} cells in "
                  f"{len(todo)} environments, {jobs} verdict worker(s) at once, latency timed alone after them"
                  + ("" if fresh == FRESH_ALL else "; unchanged cells from the store"))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("cells", total=total)
        recorder = Recorder(run_dir / "results.jsonl", Annotator(matrix.xfail), progress, task,
                            hold_passes=matrix.latency.enabled, verbose=verbose)
        scheduler = Scheduler(provider, job, matrix, meta, run_dir, recorder, jobs, memory_mb,
                              CellCache(reports, warn=_say) if fresh != FRESH_ALL else None, fresh,
                              KeyContext.for_run(matrix, meta.fingerprint, getattr(provider, "name", "venv")))
        scheduler.run(todo)
    # Runtime releases per file (harness.run.floors): the spooled files, in runtime-only envs.
    releases = annotate_run(run_dir, plan, RuntimeAxes.from_matrix(matrix), matrix.threads, log=_say,
                            install=matrix.install)
    if releases is not None:
        meta.extra["runtime_releases"] = dataclasses.asdict(releases)
    shutil.rmtree(run_dir / SPOOL_DIR, ignore_errors=True)


def _say(message: str) -> None:
    console.print(message, markup=False, highlight=False, soft_wrap=True)


class Recorder:
    """Where every record goes, from any thread: annotated (xfail, signature, hint), given its
    cache key, appended to results.jsonl, never twice. A passing verdict is held until the
    latency phase has timed it (``timing`` joins the two); so is its progress."""

    def __init__(self, results: Path, annotate: Annotator, progress: Progress, task: Any,
                 hold_passes: bool, verbose: bool = False) -> None:
        self.results, self.annotate = results, annotate
        # Which finished cells get a line: all (verbose); on a terminal, where the progress bar
        # counts the rest, failures only; elsewhere all but skips.
        quiet = {Status.SKIP} if verbose is False else set()
        if not verbose and progress.console.is_terminal:
            quiet |= {Status.PASS, Status.XFAIL}
        self.quiet = quiet
        self.progress, self.task = progress, task
        self.hold_passes = hold_passes
        self.lock = threading.RLock()
        self.recorded: set[str] = set()
        self.held: dict[str, Record] = {}
        self.keys: dict[str, str | None] = {}          # cell id → its cache key, once known
        self.died: Callable[[str], bool] = lambda cid: False
        self.cached = 0

    def verdict(self, rec: Record) -> None:
        """A record from a verdict worker, or one the runner made (skip, crash, environment)."""
        self.verdicts([rec])

    def verdicts(self, records: list[Record]) -> None:
        with self.lock:
            batch = []
            for rec in records:
                if rec.cell_id in self.recorded or rec.cell_id in self.held:
                    continue
                if self.hold_passes and rec.status is Status.PASS:
                    self.held[rec.cell_id] = rec
                else:
                    batch.append(rec)
            self._write(batch)

    def timing(self, rec: Record) -> None:
        """A record from the latency phase: joined to the held verdict of its cell."""
        with self.lock:
            verdict = self.held.pop(rec.cell_id, None)
            if verdict is not None:
                self._write([with_timing(verdict, rec)])

    def from_store(self, records: list[Record]) -> None:
        """Records taken from the store by the cell cache (they keep their key)."""
        with self.lock:
            batch = [r for r in records if r.cell_id not in self.recorded and r.cell_id not in self.held]
            self.cached += len(batch)
            self._write(batch, cached=True)

    def _write(self, records: list[Record], cached: bool = False) -> None:
        """Annotate and append (one write and fsync for the batch); cached cells are summed up
        per environment by the caller instead of a line each."""
        for rec in records:
            if not cached:
                ok = rec.status in (Status.PASS, Status.FAIL, Status.SKIP) and not self.died(rec.cell_id)
                rec.cache_key = self.keys.get(rec.cell_id) if ok else None
            self.annotate(rec)
        append_records(self.results, records)
        for rec in records:
            self.recorded.add(rec.cell_id)
            if not cached and rec.status not in self.quiet:
                mark = {Status.PASS: "[green]pass[/]", Status.SKIP: "[dim]skip[/]"}.get(rec.status, f"[red]{rec.status}[/]")
                self.progress.console.print(f"  {mark} {escape(rec.cell_id)}"
                                            + (f"  ({rec.stage}: {escape(rec.error)})" if rec.error else ""))
        self.progress.advance(self.task, len(records))


def with_timing(verdict: Record, timing: Record) -> Record:
    """A held verdict with its latency phase: the timing, or the failure that came instead (a
    crash or timeout of the latency worker stays one; anything else fails at ``latency``)."""
    verdict.latency_ms = timing.latency_ms
    for name, seconds in timing.duration_s.items():
        verdict.duration_s[name] = round(verdict.duration_s.get(name, 0.0) + seconds, 6)
    verdict.notes += [n for n in timing.notes if n not in verdict.notes]
    if timing.status is not Status.PASS:
        verdict.status = timing.status if timing.status in (Status.CRASH, Status.TIMEOUT) else Status.FAIL
        verdict.stage = Stage.LATENCY.value
        verdict.error = timing.error
        verdict.bundle = timing.bundle or verdict.bundle
        verdict.repro = timing.repro or verdict.repro
    verdict.finished_at = timing.finished_at or verdict.finished_at
    return verdict


class Scheduler:
    """Runs a plan in two phases.

    **Verdicts**, in parallel: ``jobs`` slots (threads), each supervising one worker process at a
    time. Environments are prepared one after the other in the background (downloads overlap the
    workers); as each becomes ready its cells are looked up in the cell cache and the rest queued
    as export groups (``EnvWork``). A free slot takes the environment nobody works on yet, else
    the one with the most groups left, and its worker pulls that environment's groups one at a
    time: two workers of one environment run different groups. Passing verdicts are held.

    **Latency**, serially, once every verdict worker has ended and every environment is ready:
    one latency worker per environment times the held cells' spooled files, nothing else running
    on the machine's behalf, so no timing is ever taken beside an export. (An exclusive lock
    around the latency stage would pause every other worker for each of hundreds of sub-second
    timings and leave their state in memory; the phase costs one model load per passing cell and
    one worker start per environment.)

    Containment is the supervisor's, per worker, in both phases; an interrupt stops every slot
    (``Stopped``: its worker killed, nothing recorded for it) and ends the run resumable."""

    def __init__(self, provider: Provider, job: Job, matrix: Matrix, meta: RunMeta, run_dir: Path,
                 recorder: Recorder, jobs: int, memory_mb: int | None, cache: CellCache | None,
                 fresh: str | None, keys: KeyContext) -> None:
        self.provider, self.job, self.matrix, self.meta = provider, job, matrix, meta
        self.run_dir, self.recorder, self.jobs, self.memory_mb = run_dir, recorder, jobs, memory_mb
        self.cache, self.fresh, self.key_context = cache, fresh, keys
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.works: dict[str, EnvWork] = {}
        self.assigned: dict[str, int] = {}
        self.envs_settled = False
        self.errors: list[BaseException] = []
        self.meta_lock = threading.Lock()
        self.latency_works: list[EnvWork] = []
        recorder.died = lambda cid: any(cid in w.deaths for w in [*self.works.values(), *self.latency_works])

    # -- the whole run ------------------------------------------------------------------------
    def run(self, todo: list[tuple[EnvPlan, list[Cell]]]) -> None:
        t0 = time.monotonic()
        skip_reason = {e.env.name: self.provider.skip_reason(e.env) for e, _ in todo}
        for env_plan, cells in todo:
            if why := skip_reason[env_plan.env.name]:
                self.recorder.verdicts(skip_records(self.meta.run_id, env_plan, cells, why))
        build = [(e, c) for e, c in todo if not skip_reason[e.env.name]]
        # Environments are prepared one after the other in a background thread: downloading and
        # installing the next torch (network and disk bound) overlaps the workers (CPU bound).
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-prefetch")
        slots = [threading.Thread(target=self._slot, args=(i,), name=f"slot-{i}", daemon=True)
                 for i in range(1, self.jobs + 1)]
        try:
            futures = {pool.submit(self.provider.ensure, e.env): (e, c) for e, c in build}
            for thread in slots:
                thread.start()
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._env_ready(*futures[future], future)
                self._raise_slot_error()
            with self.cond:
                self.envs_settled = True
                self.cond.notify_all()
            for thread in slots:
                while thread.is_alive():
                    thread.join(timeout=0.25)
            self._raise_slot_error()
            t1 = time.monotonic()
            self._latency_phase(build)
            t2 = time.monotonic()
        except BaseException:
            # Interrupted (or broken): every slot ends its worker; no environment install waits.
            self.stop.set()
            with self.cond:
                self.cond.notify_all()
            for thread in slots:
                if thread.is_alive():
                    thread.join(timeout=30)
            pool.shutdown(wait=False, cancel_futures=True)
            end_child_processes()
            raise
        pool.shutdown(wait=True)
        self.meta.extra["schedule"] = {
            "jobs": self.jobs, "verdict_phase_s": round(t1 - t0, 2), "latency_phase_s": round(t2 - t1, 2),
            "cached": self.recorder.cached, "fresh": self.fresh or "no",
        }
        self.meta.write(self.run_dir)

    def _raise_slot_error(self) -> None:
        if self.errors:
            raise self.errors[0]

    # -- environments --------------------------------------------------------------------------
    def _env_ready(self, env_plan: EnvPlan, cells: list[Cell], future: Any) -> None:
        """An environment is realised (or failed): record what the cache has, queue the rest."""
        env = env_plan.env
        try:
            try:
                marker = future.result()
            except OSError as exc:   # a provider's folder that cannot be made: the same failure
                raise EnvironmentBuildError(cannot_create(env.name, exc)) from exc
        except EnvironmentBuildError as exc:
            # Build logs hold brackets ("[/bin/sh -c ...]") that rich would read as markup.
            console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
            self.recorder.verdicts(environment_failure_records(self.meta.run_id, env_plan, cells, exc))
            return
        with self.meta_lock:
            self.meta.environments[env.name] = marker.to_dict()
            self.meta.write(self.run_dir)
        keys = {c.cell_id: self.key_context.key(c, env, marker) for c in cells}
        self.recorder.keys.update(keys)
        hits = (self.cache.lookup({cid: k for cid, k in keys.items() if k}, self.job.base_dir)
                if self.cache else {})
        if self.cache and self.cache.stale:
            changed = sorted({f for files in self.cache.stale.values() for f in files})
            console.print(f"{env.name}: {len(self.cache.stale)} stored cell(s) run again: files their case "
                          f"loaded changed ({', '.join(changed[:5])}{' …' if len(changed) > 5 else ''})",
                          markup=False, highlight=False)
        if self.fresh == FRESH_LATENCY:   # passing cells run again, for a fresh timing
            hits = {cid: h for cid, h in hits.items() if h[0].status not in (Status.PASS, Status.XPASS)}
        self.recorder.from_store([adopt(rec, source, self.meta.run_id, self.run_dir)
                                  for rec, source in hits.values()])
        rest = [c for c in cells if c.cell_id not in hits]
        if hits:
            console.print(f"{env.name}: {len(hits)} of {len(cells)} cells unchanged, taken from the store",
                          markup=False, highlight=False)
        with self.cond:
            self.works[env.name] = EnvWork(env_plan, env_plan.groups(rest) if rest else [])
            self.assigned[env.name] = 0
            self.cond.notify_all()

    def _env_failed(self, work: EnvWork, exc: EnvironmentBuildError) -> None:
        """A worker of the environment died before running any cell: the environment is broken;
        its cells without a record get its failure (other workers of it finish their groups)."""
        env = work.env_plan.env
        console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
        with work.lock:
            work.failed = exc
            groups = work.drain()
        cells = [c for c in work.env_plan.cells if c.cell_id in {x.cell_id for g in groups for x in g.cells}]
        self.recorder.verdicts(environment_failure_records(self.meta.run_id, work.env_plan, cells, exc))

    # -- verdict slots -------------------------------------------------------------------------
    def _next_work(self) -> EnvWork | None:
        """The environment this slot works on next; None once there is nothing left to start."""
        with self.cond:
            while not self.stop.is_set():
                ready = [(name, w) for name, w in self.works.items() if len(w)]
                if ready:
                    # Nobody on it yet first (one worker start per environment), then most left.
                    name, work = min(ready, key=lambda nw: (self.assigned[nw[0]] > 0, -len(nw[1]),
                                                             list(self.works).index(nw[0])))
                    self.assigned[name] += 1
                    return work
                if self.envs_settled:
                    return None
                self.cond.wait(timeout=0.25)
        return None

    def _slot(self, index: int) -> None:
        try:
            while (work := self._next_work()) is not None:
                env = work.env_plan.env
                log = f"worker-{env.name}.log" if index == 1 else f"worker-{env.name}-{index}.log"
                sup = WorkerSupervisor(self.provider, work.env_plan, self.job.replace(env=env.name),
                                       self.matrix.cell_timeout_s, self.recorder.verdict,
                                       on_event=self._on_event, memory_limit_mb=self.memory_mb,
                                       log_max_mb=self.matrix.log_max_mb, work=work, stop=self.stop,
                                       worker_log=log)
                try:
                    sup.run_shared()
                except EnvironmentBuildError as exc:
                    self._env_failed(work, exc)
                finally:
                    with self.cond:
                        self.assigned[env.name] -= 1
                        self._note_restarts(env.name, work)
                        self.cond.notify_all()
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            self.errors.append(exc)
            self.stop.set()

    def _note_restarts(self, name: str, work: EnvWork) -> None:
        with self.meta_lock:
            if name in self.meta.environments:
                self.meta.environments[name]["worker_restarts"] = work.early_ends

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "cell_start":
            self.recorder.progress.update(self.recorder.task, description=str(event.get("cell_id")))

    # -- the latency phase ---------------------------------------------------------------------
    def _latency_phase(self, build: list[tuple[EnvPlan, list[Cell]]]) -> None:
        """Time every held passing cell, one environment after the other, nothing else running."""
        for env_plan, cells in build:
            held = [c for c in cells if c.cell_id in self.recorder.held]
            if not held:
                continue
            env = env_plan.env
            self.recorder.progress.update(self.recorder.task, description=f"{env.name}: latency")
            work = EnvWork(env_plan)
            self.latency_works.append(work)
            sup = WorkerSupervisor(self.provider, env_plan, self.job.replace(env=env.name, phase=PHASE_LATENCY),
                                   self.matrix.cell_timeout_s, self.recorder.timing,
                                   on_event=self._on_event, memory_limit_mb=self.memory_mb,
                                   log_max_mb=self.matrix.log_max_mb, work=work, stop=self.stop)
            try:
                restarts = sup.run(held)
            except EnvironmentBuildError as exc:
                restarts = 1
                for cell in held:
                    self.recorder.timing(planned_record(self.meta.run_id, cell, env.name, Status.CRASH,
                                                        error=f"{type(exc).__name__}: {exc}"[:500]))
            if env.name in self.meta.environments:
                self.meta.environments[env.name]["latency_worker_restarts"] = restarts


def finalize(run_dir: Path, meta: RunMeta, reports: Path, order: list[str] | None = None) -> None:
    """Mark the run finished (counts, end time) and add it to the store's index and cell cache.

    Records are appended as cells finish, so while a run goes on results.jsonl is in completion
    order (workers run in parallel); with ``order`` (the plan's cell ids) a finished file that
    holds exactly those cells is rewritten in that order, so it does not depend on scheduling
    (a run resumed with another filter keeps the order its records were appended in)."""
    results = run_dir / "results.jsonl"
    records = read_records(results)
    if order and sorted(order) == sorted(r.cell_id for r in records):
        sort_results(results, order)
    meta.ended = time.time()
    meta.finished = True
    meta.counts = count_by_status(records)
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
