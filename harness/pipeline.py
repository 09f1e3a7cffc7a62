"""One matrix run from start to end: load and validate → plan (filter, shard) → execute → render.

What ``python -m harness matrix`` does, and what the checks (``bench``, ``gpu``) reuse.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.core.paths import REPORTS
from harness.matrix.config import load_matrix, shipped_matrix
from harness.matrix.plan import Plan, build_plan
from harness.matrix.rules import ConfigError, parse_only
from harness.matrix.shards import parse_shard, shard_plan
from harness.report import render_run


@dataclass(frozen=True)
class MatrixRequest:
    config: Path          # a matrix file, or the name of a shipped one (harness/matrices/): "zoo"
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


def run_matrix(req: MatrixRequest) -> Path:
    """Run the request's plan into a run directory, render its reports, return the directory."""
    from harness.run.execute import execute

    req = replace(req, config=shipped_matrix(req.config))
    plan = plan_for(req)
    run_dir = execute(plan.matrix, req.config, plan, req.output, req.reports, req.provider, req.resume)
    render_run(run_dir, req.reports)
    return run_dir
