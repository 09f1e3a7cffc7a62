"""One matrix run from start to end: load and validate → plan (filter, shard) → execute → render.

What ``python -m harness matrix`` does, and what the checks (``bench``, ``gpu``) reuse.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.core.paths import REPORTS
from harness.matrix.config import load_matrix
from harness.matrix.plan import Plan, build_plan
from harness.matrix.rules import ConfigError, parse_only
from harness.matrix.shards import parse_shard, shard_plan


@dataclass(frozen=True)
class MatrixRequest:
    config: Path
    output: Path | None = None
    reports: Path = REPORTS
    only: str | None = None
    shard: str | None = None
    provider: str = "venv"
    resume: bool = False


def plan_for(req: MatrixRequest) -> Plan:
    """The plan a request runs; ConfigError (exit 2) when the file or a filter is unusable."""
    plan = build_plan(load_matrix(req.config), parse_only(req.only))
    if shard := parse_shard(req.shard):
        plan = shard_plan(plan, *shard)
    if not plan.cells:
        raise ConfigError(f"{req.config}: the filter leaves no cells to run")
    return plan


def check_output(output: Path | None, option: str = "--output") -> None:
    """An output directory must be a directory (new, or one the command may reuse)."""
    if output is not None and output.exists() and not output.is_dir():
        raise ConfigError(f"{option} {output}: is a file; expected a directory (new, or a run directory to resume)")


def check_installable(plan: Plan, config: Path, provider_name: str) -> None:
    """Resolve every environment the plan still has to build, all of them before any is built:
    a torch (or pin, or Python) the index cannot provide is a ConfigError naming the key."""
    from harness.envs import make_provider
    from harness.envs.resolve import preflight

    provider = make_provider(provider_name, log=lambda *a, **k: None)
    ready = getattr(provider, "is_ready", lambda spec: False)
    preflight(plan, config, skip=provider.skip_reason, ready=ready)


def run_matrix(req: MatrixRequest) -> Path:
    """Run the request's plan into a run directory, render its reports, return the directory.

    Everything that can be checked without installing is checked first (the file, its case
    files, the output directory, every environment's resolution): a bad input exits 2 with
    nothing built."""
    from harness.report import render_run
    from harness.run.execute import execute

    check_output(req.output)
    plan = plan_for(req)
    check_installable(plan, req.config, req.provider)
    run_dir = execute(plan.matrix, req.config, plan, req.output, req.reports, req.provider, req.resume)
    render_run(run_dir, req.reports)
    return run_dir
