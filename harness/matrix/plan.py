"""Expand a Matrix into environments and cells (include/exclude applied, filters honoured), and
group each environment's cells into the worker's export groups."""
from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable

from harness.core.cell import CellKey, ExportOptions
from harness.core.env import EnvSpec
from harness.core.job import CellJob, ExportGroup
from harness.core.text import bounded_name
from harness.matrix.config import CaseEntry, Matrix, RuntimeSpec, TorchSpec, gc_paused
from harness.matrix.environments import env_spec_for
from harness.matrix.rules import matches
from harness.matrix.steps_config import judge_for


@dataclass(frozen=True)
class Cell:
    """A planned cell: its key, the torch it runs on, and what the worker needs to build it."""

    key: CellKey
    torch: str
    runtime_name: str
    case_ref: str
    atol: float | None = None
    rtol: float | None = None
    data_files: tuple[str, ...] = ()
    steps: tuple[dict[str, Any], ...] = field(default=(), compare=False)   # the pipeline's steps (options.pipeline names it)
    judge: dict[str, Any] | None = field(default=None, compare=False)

    @functools.cached_property
    def cell_id(self) -> str:
        return self.key.cell_id(self.torch)

    @property
    def axes(self) -> dict[str, Any]:
        return {"torch": self.torch, **self.key.axes}

    @property
    def group_key(self) -> tuple:
        """Cells sharing this share one export."""
        k = self.key
        return (k.case, k.exporter, k.opset, k.options)


@dataclass
class EnvPlan:
    env: EnvSpec
    cells: list[Cell] = field(default_factory=list)

    def groups(self, cells: Iterable[Cell] | None = None) -> list[ExportGroup]:
        """Worker export groups: one export per (case, exporter, opset, options)."""
        by_key: dict[tuple, list[Cell]] = {}
        for cell in (self.cells if cells is None else cells):
            by_key.setdefault(cell.group_key, []).append(cell)
        groups = []
        for key, members in by_key.items():
            c = members[0]
            digest = hashlib.sha1(repr((self.env.name, _legacy_group_key(c))).encode()).hexdigest()[:8]
            groups.append(ExportGroup(
                gid=bounded_name(f"{self.env.name}-{c.key.case}-{c.key.exporter}-op{c.key.opset}-{digest}", "_.-"),
                case=c.key.case, case_ref=c.case_ref, exporter=c.key.exporter, opset=c.key.opset,
                options=c.key.options, atol=c.atol, rtol=c.rtol, data_files=c.data_files,
                steps=c.steps, judge=c.judge,
                cells=tuple(CellJob(m.cell_id, m.key.runtime, m.runtime_name,
                                    self.env.runtime_options.get(m.key.runtime, {}))
                            for m in members)))
        return groups


def _legacy_group_key(c: Cell) -> tuple:
    # The group id hashes the tuple the first release used, so log file names stay the same;
    # options added later join it only when set.
    o = c.key.options
    key = (c.key.case, c.key.exporter, c.key.opset, o.constant_folding, o.dynamic, o.precision)
    key += (o.dim_policy,) if o.dim_policy is not None else ()
    later = {k: v for k, v in o.to_dict().items() if k in ("pipeline", "optimize", "external_data")}
    return key + ((tuple(sorted(later.items())),) if later else ())


@dataclass
class Plan:
    matrix: Matrix
    environments: list[EnvPlan]

    @property
    def cells(self) -> list[Cell]:
        return [c for e in self.environments for c in e.cells]

    def restricted(self, keep: set[str]) -> "Plan":
        """The same plan holding only the cells whose id is in ``keep``."""
        envs = [EnvPlan(e.env, [c for c in e.cells if c.cell_id in keep]) for e in self.environments]
        return Plan(self.matrix, [e for e in envs if e.cells])


def _cells(matrix: Matrix) -> list[tuple[TorchSpec, RuntimeSpec, Cell]]:
    out = []
    torch_by_version = {t.version: t for t in matrix.torch}
    rt_by_label = {r.label: r for r in matrix.runtimes}
    case_by_label = {c.label: c for c in matrix.cases}
    opts = matrix.options
    product = itertools.product(matrix.torch, matrix.exporters, matrix.opsets, matrix.runtimes,
                                matrix.cases, opts.constant_folding, opts.dynamic, opts.precision,
                                opts.dim_policy, opts.optimize, opts.external_data, matrix.pipelines)
    combos = [dict(torch=t, exporter=e, opset=o, runtime=r, case=c, constant_folding=f,
                   dynamic=d, precision=p, dim_policy=dp, optimize=op, external_data=ed, pipeline=pl)
              for t, e, o, r, c, f, d, p, dp, op, ed, pl in product]
    for inc in matrix.include:
        base = {"torch": matrix.torch[0].version, "exporter": matrix.exporters[0],
                "opset": matrix.opsets[0], "runtime": matrix.runtimes[0].label,
                "case": matrix.cases[0].label, **ExportOptions().to_dict(),
                "pipeline": next(iter(matrix.pipelines)), **inc.axes}
        torch_spec = torch_by_version.get(str(base["torch"])) or matrix.torch_entry(str(base["torch"]))
        rt = rt_by_label.get(str(base["runtime"])) or RuntimeSpec(name=str(base["runtime"]))
        case = case_by_label.get(str(base["case"])) or CaseEntry(target=str(base["case"]))
        combos.append(dict(base, torch=torch_spec, runtime=rt, case=case, opset=int(base["opset"])))
    seen = set()
    for c in combos:
        t, r, case = c["torch"], c["runtime"], c["case"]
        if c["exporter"] == "dynamo" and not c["constant_folding"]:
            continue  # folding is a TorchScript-exporter option; dynamo has no switch for it
        # TorchScript keeps dynamic_axes and a static export marks no dim: the policy is moot there.
        policy = c.get("dim_policy") if c["exporter"] == "dynamo" and c["dynamic"] else None
        # optimize= and external_data= are the dynamo exporter's switches: null for the others.
        dynamo = c["exporter"] == "dynamo"
        options = ExportOptions(dynamic=bool(c["dynamic"]), constant_folding=bool(c["constant_folding"]),
                                precision=str(c["precision"]), dim_policy=policy or None,
                                pipeline=str(c["pipeline"]), optimize=c.get("optimize") if dynamo else None,
                                external_data=c.get("external_data") if dynamo else None)
        key = CellKey(case.label, c["exporter"], int(c["opset"]), r.label, options)
        steps = matrix.pipelines[options.pipeline]
        overrides = {k: v.model_dump() for k, v in case.tolerances.items()}
        cell = Cell(key=key, torch=t.version, runtime_name=r.name, case_ref=case.target,
                    atol=case.atol, rtol=case.rtol, data_files=tuple(case.data_files),
                    steps=tuple(steps), judge=judge_for(steps, overrides))
        if cell.cell_id in seen:
            continue
        if any(matches(rule, cell.axes) for rule in matrix.exclude):
            continue
        seen.add(cell.cell_id)
        out.append((t, r, cell))
    return out


def build_plan(matrix: Matrix, only: dict[str, list[str]] | None = None) -> Plan:
    with gc_paused():
        return _build_plan(matrix, only)


def _build_plan(matrix: Matrix, only: dict[str, list[str]] | None) -> Plan:
    envs: dict[str, EnvPlan] = {}
    specs: dict[tuple[int, int], EnvSpec] = {}   # one per (torch, runtime), not one per cell
    for torch_spec, rt, cell in _cells(matrix):
        if only and not matches(only, cell.axes):
            continue
        env = specs.get((id(torch_spec), id(rt)))
        if env is None:
            env = specs[(id(torch_spec), id(rt))] = env_spec_for(torch_spec, rt, matrix)
        envs.setdefault(env.name, EnvPlan(env)).cells.append(cell)
    return Plan(matrix=matrix, environments=list(envs.values()))
