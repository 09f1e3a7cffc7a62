"""One matrix run from start to end: load and validate → plan (filter, shard) → execute → render.

What ``python -m harness matrix`` does, and what the bench and the GPU check reuse. Sharding
reads the durations of previous runs here (the store is a later layer than the planner) and
hands them to ``harness.matrix.shards`` as plain data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from harness.core.paths import REPORTS
from harness.core.record import Record
from harness.core.status import Stage
from harness.matrix.config import Matrix, load_matrix, shipped_matrix
from harness.matrix.plan import Plan, build_plan
from harness.matrix.rules import ConfigError, parse_only
from harness.matrix.shards import (
    DEFAULT_SETUP_S,
    Costs,
    Shard,
    parse_shard,
    pick,
    shard_identity,
    split_plan,
)

# Stages done once per export group: every cell of the group carries the same time for them.
GROUP_STAGES = (Stage.EXPORT.value, Stage.CHECK.value)
# How many of the newest finished runs "auto" durations look through.
DURATION_RUNS = 10


@dataclass(frozen=True)
class MatrixRequest:
    config: Path          # a matrix file, or the name of a shipped one (harness/matrices/): "zoo"
    output: Path | None = None
    reports: Path = REPORTS
    only: str | None = None
    shard: str | None = None
    provider: str = "venv"
    resume: bool = False
    durations: str = "auto"        # where shard costs come from: auto | none | run | file
    torch: str | None = None       # "2.6.0,2.13.0": exactly these releases, as the gate plans them
    force_resume: bool = False     # resume a run even if it was started from another matrix
    jobs: int | None = None        # verdict workers at once (None: the matrix's jobs, else cores)
    fresh: str | None = None       # None: unchanged cells from the store; "latency"; "all": no reuse
    verbose: bool = False          # print every finished cell, skips included


def load_request_matrix(req: MatrixRequest) -> tuple[Matrix, Plan]:
    """The matrix and the unsharded plan of a request (filters and --torch applied); existing
    environments are read first (their torch release names their cells)."""
    from harness.envs.existing import probe_matrix

    matrix = probe_matrix(load_matrix(req.config), shipped_matrix(req.config))
    only = parse_only(req.only) or {}
    if not req.torch:
        return matrix, build_plan(matrix, only or None)
    versions = list(dict.fromkeys(v.strip() for v in req.torch.split(",") if v.strip()))
    if not versions:
        raise ConfigError(f"--torch: expected torch releases such as 2.6.0,2.13.0 (got {req.torch!r})")
    # Each release planned exactly as the gate plans one side (unlisted ones get default pins).
    envs = []
    for version in versions:
        if "torch" in only and version not in only["torch"]:
            continue
        try:
            restricted = matrix.one_release(version)
        except ConfigError as exc:
            raise ConfigError(f"--torch: {exc}") from None
        envs += build_plan(restricted, {**only, "torch": [version]}).environments
    matrix = matrix.model_copy(update={"torch": [matrix.torch_entry(v) for v in versions]})
    return matrix, Plan(matrix, envs)


def plan_shards(req: MatrixRequest, count: int) -> tuple[Plan, list[Shard], Costs]:
    """The unsharded plan of a request, its split into ``count`` shards and the costs used."""
    _, plan = load_request_matrix(req)
    if not plan.cells:
        raise ConfigError(f"{req.config}: the filter leaves no cells to run")
    costs = read_costs(req.durations, req.reports, {c.cell_id for c in plan.cells})
    return plan, split_plan(plan, count, costs), costs


def plan_for(req: MatrixRequest) -> Plan:
    """The plan a request runs; ConfigError (exit 2) when the file or a filter is unusable."""
    shard = parse_shard(req.shard)
    if shard is None:
        _, plan = load_request_matrix(req)
    else:
        _, shards, _ = plan_shards(req, shard[1])
        plan = pick(shards, *shard).plan
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
    nothing built. A shard run records in run.json which shard of which plan and split it is
    (``shard``), so ``harness merge`` can tell a missing, repeated or foreign shard."""
    from harness.run.context import RunRequest
    from harness.run_workflow import run_plan

    req = replace(req, config=shipped_matrix(req.config))
    check_output(req.output)
    shard = parse_shard(req.shard)
    extra = {}
    if shard is None:
        plan = plan_for(req)
    else:
        full, shards, costs = plan_shards(req, shard[1])
        plan = pick(shards, *shard).plan
        extra["shard"] = {**shard_identity(full, shards, shard[0]), "durations": costs.source}
    check_installable(plan, req.config, req.provider)
    return run_plan(RunRequest(plan.matrix, req.config, plan, req.reports, req.output, req.provider,
                               req.resume, req.force_resume, jobs=req.jobs, fresh=req.fresh,
                               verbose=req.verbose, meta_extra=extra))


# Durations of previous runs -------------------------------------------------------------------


def cell_seconds(records: list[Record]) -> dict[str, float]:
    """Seconds per cell id: its own stages plus its share of its export group's export and check
    (every cell of a group carries the group's time for those)."""
    def group(rec: Record) -> tuple:
        return (rec.log,) if rec.log else (rec.env, rec.case, rec.exporter, rec.opset,
                                            json.dumps(rec.options, sort_keys=True))
    sizes: dict[tuple, int] = {}
    for rec in records:
        sizes[group(rec)] = sizes.get(group(rec), 0) + 1
    out = {}
    for rec in records:
        own = sum(v for k, v in rec.duration_s.items() if k not in GROUP_STAGES)
        shared = sum(v for k, v in rec.duration_s.items() if k in GROUP_STAGES) / sizes[group(rec)]
        out[rec.cell_id] = round(own + shared, 3)
    return out


def read_costs(source: str | None, reports: Path = REPORTS, wanted: set[str] | None = None) -> Costs:
    """Costs from ``source``: ``auto`` (the newest finished whole or merged runs in the store,
    newest duration per cell), ``none`` (cell count), a run (directory, id or ``latest``), or a
    JSON file: ``plan --format json`` output or ``{cell_id: seconds}``. Only the cells in
    ``wanted`` (when given) are kept."""
    from harness.store.reuse import finished_runs
    from harness.store.runs import load_run, resolve_run

    def keep(seconds: dict[str, float]) -> dict[str, float]:
        return seconds if wanted is None else {k: v for k, v in seconds.items() if k in wanted}

    source = source or "auto"
    if source == "none":
        return Costs()
    if source == "auto":
        found: dict[str, float] = {}
        used = []
        for run in finished_runs(reports):
            if "shard" in run.meta.extra:
                continue  # a shard run holds part of a matrix; its merge is the run to learn from
            new = {k: v for k, v in keep(cell_seconds(run.records)).items() if k not in found}
            if new:
                found.update(new)
                used.append(run.meta.run_id)
            if len(used) >= DURATION_RUNS or (wanted is not None and len(found) == len(wanted)):
                break
        return Costs(found, source=", ".join(used)) if found else Costs()
    path = Path(source)
    if path.is_file():
        costs = _costs_from_file(path)
        return Costs(keep(dict(costs.cells)), costs.setup_s, costs.source)
    try:
        run_dir = resolve_run(source, reports)
    except FileNotFoundError:
        raise ConfigError(f"--durations: {source!r} is neither auto, none, a JSON file nor a run "
                          f"(directory, id or 'latest' under {reports})") from None
    meta, records = load_run(run_dir)
    return Costs(keep(cell_seconds(records)), source=meta.run_id)


def _costs_from_file(path: Path) -> Costs:
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("durations"), dict):
        block = data["durations"]
        cells, setup = block.get("cells", {}), block.get("setup_s", DEFAULT_SETUP_S)
        source = str(block.get("source") or path)
    else:
        cells, setup, source = data, DEFAULT_SETUP_S, str(path)
    if not isinstance(cells, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                              and not isinstance(v, bool) for k, v in cells.items()):
        raise ConfigError(f"{path}: key 'durations.cells': expected an object of cell id → seconds")
    if not isinstance(setup, (int, float)) or setup < 0:
        raise ConfigError(f"{path}: key 'durations.setup_s': expected seconds >= 0 (got {setup!r})")
    return Costs({k: float(v) for k, v in cells.items()}, setup_s=float(setup), source=source)


def costs_block(plan: Plan, costs: Costs) -> dict:
    """The durations a split used, as ``plan --format json`` writes them (readable by --durations)."""
    ids = sorted(c.cell_id for c in plan.cells)
    return {"source": costs.source, "setup_s": costs.setup_s,
            "cells": {i: costs.cells[i] for i in ids if i in costs.cells}}
