"""Run a plan end to end: hold the run directory → environments → workers → results.jsonl + run.json.

The protocol of a run, each job in its module: the run directory's lifecycle
(``harness.store.rundir``), signal handling (``signals``), the scheduler (``scheduler``: parallel
verdicts, then the latency phase; the cell cache), the results writer (``results_writer``) and the progress
output (``progress``). Rendering the reports of the finished run is the workflow's
(``harness.run_workflow``).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path

import psutil
from rich.markup import escape

from harness.console import console
from harness.core.job import PHASE_VERDICTS, SPOOL_DIR, Job
from harness.envs import make_provider
from harness.matrix.config import Matrix
from harness.matrix.rules import ConfigError
from harness.run.annotate import Annotator
from harness.run.context import FRESH_ALL, FRESH_MODES, Limits, RunContext, RunRequest
from harness.run.post.runtime_floors import RuntimeAxes, annotate_run
from harness.run.progress import RunProgress
from harness.run.results_writer import ResultsWriter
from harness.run.scheduler import Scheduler, plan_needs
from harness.run.signals import RunInterrupted, interruptible
from harness.store.cache import CellCache, KeyContext
from harness.store.rundir import HeldRun, held_run


def execute(request: RunRequest) -> Path:
    """Run ``request.plan`` into a run directory (held by this process alone) and finalize it.

    Latency is timed after the parallel verdicts, alone. A second runner on the same directory is
    refused (``RunDirBusy``, with the holder's pid); SIGTERM/SIGINT/SIGHUP end the workers and
    raise ``RunInterrupted``, the run left resumable."""
    if request.fresh not in FRESH_MODES:
        raise ConfigError(f"--fresh: expected one of {', '.join(m for m in FRESH_MODES if m)} "
                          f"(got {request.fresh!r})")
    jobs = resolve_jobs(request.jobs, request.matrix)
    with interruptible(), held_run(request.reports, request.matrix, request.config_path, request.plan,
                                   request.output, request.resume, request.force_resume,
                                   request.meta_extra) as run:
        try:
            _execute(request, run, jobs)
        except RunInterrupted as exc:
            console.print(f"interrupted by {signal.Signals(exc.signum).name}: workers stopped; run "
                          f"{run.meta.run_id} is unfinished, resume it with --output {run.run_dir}",
                          markup=False, highlight=False, soft_wrap=True)
            raise
    return run.run_dir


def cell_memory_limit(matrix: Matrix, jobs: int = 1) -> int | None:
    """``cell_memory_mb``: as set; 0 for none; unset: half of this machine's memory, shared by
    the ``jobs`` workers that may run at once."""
    if matrix.cell_memory_mb is not None:
        return matrix.cell_memory_mb or None
    return psutil.virtual_memory().total // 2 // max(1, jobs) // 2**20


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


def run_context(request: RunRequest, run: HeldRun, jobs: int) -> RunContext:
    """The context every part of the run core shares, for a held run directory."""
    matrix = request.matrix
    provider = (make_provider(request.provider, log=console.print) if isinstance(request.provider, str)
                else request.provider)
    job = Job(run_id=run.meta.run_id, run_dir=str(run.run_dir), env="", groups=(),
              base_dir=str(request.config_path.resolve().parent), threads=matrix.threads,
              latency=matrix.latency, phase=PHASE_VERDICTS, determinism=matrix.determinism,
              keep_spool=bool(RuntimeAxes.from_matrix(matrix)) or request.keep_spool)
    limits = Limits(matrix.cell_timeout_s, cell_memory_limit(matrix, jobs), matrix.log_max_mb)
    return RunContext(job=job, provider=provider, limits=limits, meta=run.meta, request=request, jobs=jobs)


def _execute(request: RunRequest, run: HeldRun, jobs: int) -> None:
    ctx = run_context(request, run, jobs)
    run_dir, meta, matrix = run.run_dir, run.meta, request.matrix
    (run_dir / "logs").mkdir(exist_ok=True)
    # A spool left by an interrupted run belongs to verdicts that were never written: they run again.
    shutil.rmtree(run_dir / SPOOL_DIR, ignore_errors=True)
    meta.extra["limits"] = {"cell_memory_mb": ctx.limits.memory_mb, "log_max_mb": matrix.log_max_mb}
    todo = [(e, cells) for e, cells in plan_needs(request.plan, run.done) if cells]
    total = sum(len(cells) for _, cells in todo)
    console.print(f"run [bold]{meta.run_id}[/] → {escape(str(run_dir))}: {total} cells in "
                  f"{len(todo)} environments, {jobs} verdict worker(s) at once, latency timed alone after them"
                  + ("" if request.fresh == FRESH_ALL else "; unchanged cells from the store"))
    with RunProgress(total, request.verbose) as progress:
        writer = ResultsWriter(run_dir / "results.jsonl", Annotator(matrix.xfail), progress,
                            hold_passes=matrix.latency.enabled)
        cache = CellCache(request.reports, warn=_say) if request.fresh != FRESH_ALL else None
        keys = KeyContext.for_run(matrix, meta.fingerprint, getattr(ctx.provider, "name", "venv"))
        Scheduler(ctx, writer, cache, keys).run(todo)
    # Runtime releases per file (harness.run.post.runtime_floors): the spooled files, in runtime-only envs.
    releases = annotate_run(run_dir, request.plan, RuntimeAxes.from_matrix(matrix), matrix.threads, log=_say,
                            install=matrix.install)
    if releases is not None:
        meta.extra["runtime_releases"] = dataclasses.asdict(releases)
    # Remedies seen in the run's own cells, on each blamed failure, and its hint from the blame.
    from harness.run.post.remedies import remedies_run

    try:
        remedies_run(run_dir)
    except Exception as exc:  # noqa: BLE001 - the verdicts stand; the run says the pass was not made
        why = f"{type(exc).__name__}: {exc}"[:300]
        meta.extra["remedies_not_made"] = why
        _say(f"remedies from the matrix's own cells not added: {why}")
    if not request.keep_spool:
        shutil.rmtree(run_dir / SPOOL_DIR, ignore_errors=True)
    if matrix.reduce:
        # Before the run is finalized: a reduction that could not be made is in its run.json.
        from harness.run.post.reduction import reduce_run

        reduce_run(run_dir, timeout_s=matrix.reduce_timeout_s, log=_say)


def _say(message: str) -> None:
    console.print(message, markup=False, highlight=False, soft_wrap=True)
