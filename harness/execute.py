"""Run a matrix end to end: plan → environments → workers → results.jsonl + run.json + matrix.md."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.annotate import Annotator
from harness.config import Matrix, matrix_hash
from harness.envs import EnvironmentBuildError, VenvProvider
from harness.plan import Plan
from harness.records import Record, append_record, count_by_status, read_records
from harness.runner import WorkerSupervisor, environment_failure_records, plan_needs, skip_records
from harness.runtimes import gpu_unavailable_reason
from harness.store import new_run_id, read_run_meta, start_run_meta, write_json_atomic

console = Console(stderr=True)


def make_provider(name: str):
    if name == "venv":
        return VenvProvider(log=console.print)
    if name == "docker":
        from harness.docker_provider import DockerProvider

        return DockerProvider(log=console.print)
    raise ValueError(f"unknown provider {name!r}; expected 'venv' or 'docker'")


def env_skip_reason(provider, env) -> str | None:
    """Why an environment is skipped here: the provider's say (Docker: no daemon, no GPU access),
    else a GPU environment on a machine without one."""
    if hasattr(provider, "skip_reason"):
        return provider.skip_reason(env)
    return gpu_unavailable_reason() if env.needs_gpu else None


def prepare_run_dir(output: Path | None, reports: Path, matrix: Matrix, config_path: Path,
                    plan: Plan, resume: bool) -> tuple[Path, dict[str, Any], set[str]]:
    """Create a new run directory, or reopen an unfinished one to resume it."""
    mhash = matrix_hash(matrix)
    if output is not None and (output / "run.json").exists():
        meta = read_run_meta(output)
        if meta.get("finished"):
            raise SystemExit(f"{output} holds a finished run ({meta['run_id']}); finished runs are "
                             "immutable: choose another --output")
        done = {r.cell_id for r in read_records(output / "results.jsonl")}
        meta["resumed"].append(time.time())
        console.print(f"[bold]resuming[/] {meta['run_id']}: {len(done)} cells already recorded")
        return output, meta, done
    if output is None and resume:
        from harness.store import list_runs

        unfinished = [p for p in list_runs(reports) if not read_run_meta(p).get("finished")]
        if unfinished:
            return prepare_run_dir(unfinished[-1], reports, matrix, config_path, plan, resume)
    run_id = new_run_id(mhash)
    run_dir = output or reports / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    summary = {"cells": len(plan.cells), "environments": [e.env.to_dict() for e in plan.environments]}
    meta = start_run_meta(run_dir, run_id, config_path, mhash, summary)
    # Case sources and harness version: lets the gate reuse this run when nothing has changed.
    from harness.gate_sources import fingerprint

    meta["fingerprint"] = fingerprint(matrix, config_path)
    write_json_atomic(run_dir / "run.json", meta)
    return run_dir, meta, set()


def execute(matrix: Matrix, config_path: Path, plan: Plan, output: Path | None, reports: Path,
            provider_name: str = "venv", resume: bool = False) -> Path:
    provider = make_provider(provider_name)
    run_dir, meta, done = prepare_run_dir(output, reports, matrix, config_path, plan, resume)
    (run_dir / "logs").mkdir(exist_ok=True)
    results = run_dir / "results.jsonl"
    annotate = Annotator(matrix.xfail)
    job_extra = {"base_dir": str(config_path.resolve().parent), "threads": matrix.threads,
                 "latency": matrix.latency.model_dump(), "provider": provider_name}
    todo = plan_needs(plan, done)
    total = sum(len(cells) for _, cells in todo)
    console.print(f"run [bold]{meta['run_id']}[/] → {run_dir}: {total} cells in "
                  f"{sum(1 for _, c in todo if c)} environments")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("cells", total=total)

        def record(rec: Record) -> None:
            rec = annotate(rec)
            append_record(results, rec)
            mark = {"pass": "[green]pass[/]", "skip": "[dim]skip[/]"}.get(rec.status, f"[red]{rec.status}[/]")
            progress.console.print(f"  {mark} {rec.cell_id}" + (f"  ({rec.stage}: {rec.error})" if rec.error else ""))
            progress.advance(task)

        # Environments are prepared one ahead in a background thread: downloading and installing
        # the next torch (network and disk bound) overlaps the current worker (CPU bound).
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-prefetch")
        futures = {env_plan.env.name: pool.submit(provider.ensure, env_plan.env)
                   for env_plan, cells in todo
                   if cells and not env_skip_reason(provider, env_plan.env)}
        for env_plan, cells in todo:
            if not cells:
                continue
            env = env_plan.env
            progress.update(task, description=f"{env.name}")
            if why := env_skip_reason(provider, env):
                for rec in skip_records(meta["run_id"], env_plan, cells, why):
                    record(rec)
                continue
            try:
                progress.update(task, description=f"{env.name}: preparing environment")
                info = futures[env.name].result()
                meta["environments"][env.name] = info
                write_json_atomic(run_dir / "run.json", meta)
                progress.update(task, description=f"{env.name}")
                sup = WorkerSupervisor(provider, env_plan, meta["run_id"], run_dir, job_extra,
                                       matrix.cell_timeout_s, record,
                                       on_event=lambda e: e.get("event") == "cell_start" and progress.update(
                                           task, description=f"{e['cell_id']}"))
                restarts = sup.run(cells)
                meta["environments"][env.name]["worker_restarts"] = restarts
            except EnvironmentBuildError as exc:
                # Build logs hold brackets ("[/bin/sh -c ...]") that rich would read as markup.
                console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
                for rec in environment_failure_records(meta["run_id"], env_plan, cells, exc):
                    record(rec)
            write_json_atomic(run_dir / "run.json", meta)
        pool.shutdown(wait=True)
    finalize(run_dir, meta, reports)
    return run_dir


def finalize(run_dir: Path, meta: dict[str, Any], reports: Path) -> None:
    from harness.report_html import write_reports
    from harness.store import update_index

    records = read_records(run_dir / "results.jsonl")
    meta["ended"] = time.time()
    meta["finished"] = True
    meta["counts"] = count_by_status(records)
    write_json_atomic(run_dir / "run.json", meta)
    update_index(run_dir, reports)
    md = write_reports(run_dir, records, meta, reports)
    if len(records) < 80:
        console.print(md.read_text(), markup=False, highlight=False)
    console.print(f"matrix: {md} · {md.with_suffix('.html')}")
