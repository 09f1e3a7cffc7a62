"""Expand a Matrix into environments and cells (include/exclude applied, filters honoured)."""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from harness.config import CaseEntry, Matrix, RuntimeSpec, TorchSpec
from harness.envs import EnvSpec, env_specs_for


@dataclass(frozen=True)
class Cell:
    torch: str
    exporter: str
    opset: int
    runtime: str          # label: 'ort-cpu' or 'ort-cpu@1.20.1'
    runtime_name: str
    case: str
    case_ref: str
    constant_folding: bool = True
    dynamic: bool = True
    precision: str = "fp32"
    atol: float | None = None
    rtol: float | None = None

    @property
    def axes(self) -> dict[str, Any]:
        return {"torch": self.torch, "exporter": self.exporter, "opset": self.opset,
                "runtime": self.runtime, "case": self.case,
                "constant_folding": self.constant_folding, "dynamic": self.dynamic,
                "precision": self.precision}

    @property
    def options(self) -> dict[str, Any]:
        return {"constant_folding": self.constant_folding, "dynamic": self.dynamic,
                "precision": self.precision}

    @property
    def group_key(self) -> tuple:
        return (self.case, self.exporter, self.opset, self.constant_folding, self.dynamic, self.precision)

    @property
    def cell_id(self) -> str:
        extra = "".join([
            "" if self.dynamic else "-static",
            "" if self.constant_folding else "-nofold",
            "" if self.precision == "fp32" else f"-{self.precision}",
        ])
        raw = f"torch{self.torch}-{self.case}-{self.exporter}-op{self.opset}{extra}-{self.runtime}"
        return re.sub(r"[^A-Za-z0-9_.@-]+", "_", raw)


@dataclass
class EnvPlan:
    env: EnvSpec
    cells: list[Cell] = field(default_factory=list)

    def groups(self, cells: Iterable[Cell] | None = None) -> list[dict[str, Any]]:
        """Worker job groups: one export per (case, exporter, opset, options)."""
        by_key: dict[tuple, list[Cell]] = {}
        for cell in (self.cells if cells is None else cells):
            by_key.setdefault(cell.group_key, []).append(cell)
        groups = []
        for key, members in by_key.items():
            c = members[0]
            digest = hashlib.sha1(repr((self.env.name, key)).encode()).hexdigest()[:8]
            groups.append({
                "gid": re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.env.name}-{c.case}-{c.exporter}-op{c.opset}-{digest}"),
                "case": c.case, "case_ref": c.case_ref, "exporter": c.exporter, "opset": c.opset,
                "options": c.options, "atol": c.atol, "rtol": c.rtol,
                "cells": [{"cell_id": m.cell_id, "runtime": m.runtime, "runtime_name": m.runtime_name,
                           "runtime_options": self.env.runtime_options.get(m.runtime, {})}
                          for m in members],
            })
        return groups


@dataclass
class Plan:
    matrix: Matrix
    environments: list[EnvPlan]

    @property
    def cells(self) -> list[Cell]:
        return [c for e in self.environments for c in e.cells]


def matches(rule: dict[str, Any], axes: dict[str, Any]) -> bool:
    """asv-style rule matching: every key in the rule must match; lists mean any-of."""
    for key, want in rule.items():
        values = want if isinstance(want, list) else [want]
        if str(axes.get(key)) not in {str(v) for v in values} and not any(
            isinstance(v, str) and v.startswith("~") and re.fullmatch(v[1:], str(axes.get(key)))
            for v in values
        ):
            return False
    return True


def parse_only(expr: str | None) -> dict[str, list[str]]:
    """'torch=2.13.0,exporter=dynamo|torchscript' → {'torch': ['2.13.0'], 'exporter': [...]}."""
    from harness.config import AXES, ConfigError

    rule: dict[str, list[str]] = {}
    for part in filter(None, (expr or "").split(",")):
        if "=" not in part:
            raise ConfigError(f"--only: expected AXIS=VALUE pairs separated by commas, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in AXES:
            raise ConfigError(f"--only: unknown axis {key!r}; expected one of {list(AXES)}")
        rule.setdefault(key, []).extend(value.split("|"))
    return rule


def _cells(matrix: Matrix) -> list[tuple[TorchSpec, RuntimeSpec, Cell]]:
    out = []
    torch_by_version = {t.version: t for t in matrix.torch}
    rt_by_label = {r.label: r for r in matrix.runtimes}
    case_by_label = {c.label: c for c in matrix.cases}
    opts = matrix.options
    product = itertools.product(matrix.torch, matrix.exporters, matrix.opsets, matrix.runtimes,
                                matrix.cases, opts.constant_folding, opts.dynamic, opts.precision)
    combos = [dict(torch=t, exporter=e, opset=o, runtime=r, case=c, constant_folding=f,
                   dynamic=d, precision=p) for t, e, o, r, c, f, d, p in product]
    for inc in matrix.include:
        base = {"torch": matrix.torch[0].version, "exporter": matrix.exporters[0],
                "opset": matrix.opsets[0], "runtime": matrix.runtimes[0].label,
                "case": matrix.cases[0].label, "constant_folding": True, "dynamic": True,
                "precision": "fp32", **inc}
        torch_spec = torch_by_version.get(str(base["torch"])) or TorchSpec(version=str(base["torch"]))
        rt = rt_by_label.get(str(base["runtime"])) or RuntimeSpec(name=str(base["runtime"]))
        case = case_by_label.get(str(base["case"])) or CaseEntry(target=str(base["case"]))
        combos.append(dict(base, torch=torch_spec, runtime=rt, case=case, opset=int(base["opset"])))
    seen = set()
    for c in combos:
        t, r, case = c["torch"], c["runtime"], c["case"]
        if c["exporter"] == "dynamo" and not c["constant_folding"]:
            continue  # folding is a TorchScript-exporter option; dynamo has no switch for it
        cell = Cell(torch=t.version, exporter=c["exporter"], opset=int(c["opset"]), runtime=r.label,
                    runtime_name=r.name, case=case.label, case_ref=case.target,
                    constant_folding=bool(c["constant_folding"]), dynamic=bool(c["dynamic"]),
                    precision=str(c["precision"]), atol=case.atol, rtol=case.rtol)
        if cell.cell_id in seen:
            continue
        if any(matches(rule, cell.axes) for rule in matrix.exclude):
            continue
        seen.add(cell.cell_id)
        out.append((t, r, cell))
    return out


def build_plan(matrix: Matrix, only: dict[str, list[str]] | None = None) -> Plan:
    envs: dict[str, EnvPlan] = {}
    for torch_spec, rt, cell in _cells(matrix):
        if only and not matches(only, cell.axes):
            continue
        env = env_specs_for(torch_spec, rt, matrix)
        envs.setdefault(env.name, EnvPlan(env)).cells.append(cell)
    return Plan(matrix=matrix, environments=list(envs.values()))
