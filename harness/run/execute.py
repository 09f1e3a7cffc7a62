"""Run a matrix end to end: plan → environments → workers → results.jsonl + run.json.

Rendering the reports of the finished run is the caller's (``harness.report.render_run``).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
from harness.core.record import Record, append_record, count_by_status, read_records
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.envs import make_provider
from harness.envs.provider import EnvironmentBuildError
from harness.matrix.config import Matrix, matrix_hash
from harness.matrix.plan import Plan
from harness.run.annotate import Annotator
from harness.run.supervisor import (
    WorkerSupervisor,
    environment_failure_records,
    plan_needs,
    skip_records,
)
from harness.store.provenance import fingerprint
from harness.store.runs import list_runs, new_run_id, read_run_meta, update_index

console = Console(stderr=True)


def prepare_run_dir(output: Path | None, reports: Path, matrix: Matrix, config_path: Path,
                    plan: Plan, resume: bool) -> tuple[Path, RunMeta, set[str]]:
    """Create a new run directory, or reopen an unfinished one to resume it."""
    mhash = matrix_hash(matrix)
    if output is not None and (output / "run.json").exists():
        meta = read_run_meta(output)
        if meta.finished:
            raise SystemExit(f"{output} holds a finished run ({meta.run_id}); finished runs are "
                             "immutable: choose another --output")
        done = {r.cell_id for r in read_records(output / "results.jsonl")}
        meta.resumed.append(time.time())
        console.print(f"[bold]resuming[/] {meta.run_id}: {len(done)} cells already recorded")
        return output, meta, done
    if output is None and resume:
        unfinished = [p for p in list_runs(reports) if not read_run_meta(p).finished]
        if unfinished:
            return prepare_run_dir(unfinished[-1], reports, matrix, config_path, plan, resume)
    run_id = new_run_id(mhash)
    run_dir = output or reports / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    summary = {"cells": len(plan.cells), "environments": [e.env.to_dict() for e in plan.environments]}
    meta = RunMeta.start(run_id, __version__, config_path, mhash, summary)
    # Case sources and harness version: lets the gate reuse this run when nothing has changed.
    meta.fingerprint = fingerprint(matrix, config_path)
    meta.write(run_dir)
    return run_dir, meta, set()


def execute(matrix: Matrix, config_path: Path, plan: Plan, output: Path | None, reports: Path,
            provider_name: str = "venv", resume: bool = False) -> Path:
    provider = make_provider(provider_name, log=console.print)
    run_dir, meta, done = prepare_run_dir(output, reports, matrix, config_path, plan, resume)
    (run_dir / "logs").mkdir(exist_ok=True)
    results = run_dir / "results.jsonl"
    annotate = Annotator(matrix.xfail)
    job = Job(run_id=meta.run_id, run_dir=str(run_dir), env="", groups=(),
              base_dir=str(config_path.resolve().parent), threads=matrix.threads, latency=matrix.latency)
    todo = plan_needs(plan, done)
    total = sum(len(cells) for _, cells in todo)
    console.print(f"run [bold]{meta.run_id}[/] → {run_dir}: {total} cells in "
                  f"{sum(1 for _, c in todo if c)} environments")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("cells", total=total)

        def record(rec: Record) -> None:
            rec = annotate(rec)
            append_record(results, rec)
            mark = {Status.PASS: "[green]pass[/]", Status.SKIP: "[dim]skip[/]"}.get(rec.status, f"[red]{rec.status}[/]")
            progress.console.print(f"  {mark} {rec.cell_id}" + (f"  ({rec.stage}: {escape(rec.error)})" if rec.error else ""))
            progress.advance(task)

        skip_reason = {e.env.name: provider.skip_reason(e.env) for e, cells in todo if cells}
        # Environments are prepared one ahead in a background thread: downloading and installing
        # the next torch (network and disk bound) overlaps the current worker (CPU bound).
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-prefetch")
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
                                           task, description=f"{e['cell_id']}"))
                restarts = sup.run(cells)
                meta.environments[env.name]["worker_restarts"] = restarts
            except EnvironmentBuildError as exc:
                # Build logs hold brackets ("[/bin/sh -c ...]") that rich would read as markup.
                console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
                for rec in environment_failure_records(meta.run_id, env_plan, cells, exc):
                    record(rec)
            meta.write(run_dir)
        pool.shutdown(wait=True)
    finalize(run_dir, meta, reports)
    return run_dir


def finalize(run_dir: Path, meta: RunMeta, reports: Path) -> None:
    """Mark the run finished (counts, end time) and add it to the store's index."""
    records = read_records(run_dir / "results.jsonl")
    meta.ended = time.time()
    meta.finished = True
    meta.counts = count_by_status(records)
    meta.write(run_dir)
    update_index(run_dir, reports)
