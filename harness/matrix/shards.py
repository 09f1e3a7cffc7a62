"""Beyond one machine: environment-affine, cost-balanced shards of a plan (merging the finished
shard runs is ``harness.store.merge``).

A shard is a set of whole export groups (an export is never done twice) taken from as few
environments as balance allows, so a shard installs only the environments it runs. GPU and CPU
environments never share a shard (they need different machines) unless there is one shard.

Balance is by estimated seconds: a cell costs its duration in a previous run (``Costs.cells``,
cell id → seconds, read by the caller from the store) and, where none is known, the mean of the
known cells of its runtime (or of all known cells); without any duration every cell costs the
same (cell count). Each environment a shard installs adds ``Costs.setup_s``.

The split: shards are allotted to the GPU and CPU pools by cost; in each pool whole environments
go longest-first to the least loaded shard, then export groups move from the most loaded shard
to another while that lowers the larger of the two, counting the setup of an environment the
receiver does not have yet. An environment is thus split only when it dominates: when the
imbalance it leaves exceeds the cost of installing it twice. Every order is by cell id or
environment label (no dict or hash order), so every machine computes the same split.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from harness.matrix.plan import Cell, EnvPlan, Plan
from harness.matrix.rules import ConfigError

NOMINAL_CELL_S = 2.0      # a cell's cost when no duration is known (export share + latency ≥ 1.2 s)
DEFAULT_SETUP_S = 120.0   # installing one environment on a fresh runner (torch wheels from a cache)
_EPS = 1e-9


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'2/4' → (2, 4), shards counted from 1."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--shard: expected K/N with 1 <= K <= N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Costs:
    """What the split balances: seconds per cell id from a previous run, and per environment set up."""

    cells: Mapping[str, float] = field(default_factory=dict)
    setup_s: float = DEFAULT_SETUP_S
    source: str = "cell count"     # where the durations came from (a run id, a file), for display

    def per_cell(self, cells: list[Cell]) -> dict[str, float]:
        """A cost for every cell: its known duration, else the mean of its runtime's known cells,
        else the mean of all known cells, else the nominal cost (all equal: cell count)."""
        ordered = sorted(cells, key=lambda c: c.cell_id)
        known = {c.cell_id: float(self.cells[c.cell_id]) for c in ordered if c.cell_id in self.cells}
        by_runtime: dict[str, list[float]] = {}
        for c in ordered:
            if c.cell_id in known:
                by_runtime.setdefault(c.key.runtime, []).append(known[c.cell_id])
        overall = math.fsum(known.values()) / len(known) if known else NOMINAL_CELL_S
        means = {rt: math.fsum(v) / len(v) for rt, v in by_runtime.items()}
        return {c.cell_id: known.get(c.cell_id, means.get(c.key.runtime, overall)) for c in ordered}


@dataclass
class Shard:
    """One shard: its index (1-based) of ``count``, the plan it runs, and its estimated seconds."""

    index: int
    count: int
    plan: Plan
    estimated_s: float

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def cells(self) -> list[Cell]:
        return self.plan.cells

    @property
    def environments(self) -> list[str]:
        """Machine-independent environment labels (torch, family, pinned runtime)."""
        return [env_label(e) for e in self.plan.environments]

    @property
    def gpu(self) -> bool:
        return any(e.env.needs_gpu for e in self.plan.environments)


def env_label(env_plan: EnvPlan) -> str:
    """An environment's name without its spec hash: the hash covers local wheel folders, which
    differ between machines, while the label is the same wherever the plan is computed."""
    return env_plan.env.name.rsplit("-", 1)[0]


def digest(cell_ids: Iterable[str]) -> str:
    """A short hash of a set of cell ids (order-free)."""
    return hashlib.sha256("\n".join(sorted(cell_ids)).encode()).hexdigest()[:16]


@dataclass
class _Group:
    env: str
    key: str               # smallest cell id of the group: a stable, machine-independent order
    cells: list[Cell]
    cost: float


@dataclass
class _Bin:
    gpu: bool                                                         # may host GPU environments
    groups: dict[str, list[_Group]] = field(default_factory=dict)   # env label → groups

    def load(self, setup_s: float) -> float:
        return setup_s * len(self.groups) + math.fsum(g.cost for gs in self.groups.values() for g in gs)


def _groups(plan: Plan, costs: Costs) -> dict[str, list[_Group]]:
    """Per environment label, its export groups in cell-id order."""
    per_cell = costs.per_cell(plan.cells)
    out: dict[str, list[_Group]] = {}
    for env_plan in plan.environments:
        label = env_label(env_plan)
        if label in out:
            raise ConfigError(f"two environments share the label {label!r}; cannot shard this plan")
        by_key: dict[tuple, list[Cell]] = {}
        for cell in env_plan.cells:
            by_key.setdefault(cell.group_key, []).append(cell)
        groups = []
        for cells in by_key.values():
            cells = sorted(cells, key=lambda c: c.cell_id)
            groups.append(_Group(label, cells[0].cell_id, cells,
                                 math.fsum(per_cell[c.cell_id] for c in cells)))
        out[label] = sorted(groups, key=lambda g: g.key)
    return out


def _pack(groups: dict[str, list[_Group]], gpu_envs: set[str], kinds: list[bool], setup_s: float,
          ceiling: float | None = None) -> list[_Bin]:
    """Environments longest-first onto the least loaded bin that may host them (GPU ones first,
    they have fewer places), then groups moved to rebalance (only out of bins loaded above
    ``ceiling``, when given)."""
    bins = [_Bin(gpu) for gpu in kinds]
    envs = sorted(groups, key=lambda e: (e not in gpu_envs, -math.fsum(g.cost for g in groups[e]), e))
    for env in envs:
        allowed = [i for i, b in enumerate(bins) if b.gpu or env not in gpu_envs]
        target = min(allowed, key=lambda i: (bins[i].load(setup_s), i))
        bins[target].groups[env] = list(groups[env])
    for _ in range(10 * sum(len(g) for g in groups.values()) + 10):
        if not _rebalance_once(bins, gpu_envs, setup_s, ceiling):
            break
    return bins


def _rebalance_once(bins: list[_Bin], gpu_envs: set[str], setup_s: float, ceiling: float | None) -> bool:
    """One move of export groups of one environment out of the most loaded bin that can lower
    the larger of it and the receiver; False when no bin above ``ceiling`` has such a move."""
    loads = [b.load(setup_s) for b in bins]
    for h in sorted(range(len(bins)), key=lambda i: (-loads[i], i)):
        if ceiling is not None and loads[h] <= ceiling + _EPS:
            break
        move = _best_move(bins, loads, h, gpu_envs, setup_s)
        if move is None:
            continue
        r, env, moved = move
        keys = {g.key for g in moved}
        rest = [g for g in bins[h].groups[env] if g.key not in keys]
        if rest:
            bins[h].groups[env] = rest
        else:
            del bins[h].groups[env]
        bins[r].groups[env] = sorted(bins[r].groups.get(env, []) + moved, key=lambda g: g.key)
        return True
    return False


def _best_move(bins: list[_Bin], loads: list[float], h: int, gpu_envs: set[str],
               setup_s: float) -> tuple[int, str, list[_Group]] | None:
    """The receiver, environment and groups whose move out of bin ``h`` lowers the larger of the
    two loads the most (an environment new to the receiver costs its setup there)."""
    best: tuple[float, int, str, list[_Group]] | None = None
    for r in range(len(bins)):
        if r == h:
            continue
        for env in sorted(bins[h].groups):
            if env in gpu_envs and not bins[r].gpu:
                continue
            extra = 0.0 if env in bins[r].groups else setup_s
            room = (loads[h] - loads[r] - extra) / 2
            if room <= _EPS:
                continue
            moved, total = [], 0.0
            for g in sorted(bins[h].groups[env], key=lambda g: (-g.cost, g.key)):
                if total + g.cost <= room + _EPS:
                    moved.append(g)
                    total += g.cost
            if not moved:
                continue
            emptied = len(moved) == len(bins[h].groups[env])
            new_h = loads[h] - total - (setup_s if emptied else 0.0)
            gain = loads[h] - max(new_h, loads[r] + total + extra)
            if gain > _EPS and (best is None or gain > best[0] + _EPS):
                best = (gain, r, env, moved)
    return None if best is None else best[1:]


def _makespan(bins: list[_Bin], setup_s: float) -> float:
    return max((b.load(setup_s) for b in bins), default=0.0)


def split_plan(plan: Plan, count: int, costs: Costs | None = None) -> list[Shard]:
    """The plan in ``count`` shards, or fewer where more would not shorten the longest one (or
    there are fewer export groups), in a fixed order: CPU shards first, then GPU shards.

    The result is a fixed point: splitting into as many shards as it returned gives the same
    shards, so a job told "K/N" by the plan recomputes exactly that split."""
    if count < 1:
        raise ConfigError(f"--shards: expected a positive number of shards, got {count}")
    if not plan.cells:
        return []
    costs = costs or Costs()
    shards = _split(plan, count, costs)
    while len(shards) < count:
        count = len(shards)
        shards = _split(plan, count, costs)
    return shards


def _split(plan: Plan, count: int, costs: Costs) -> list[Shard]:
    groups = _groups(plan, costs)
    gpu_envs = {env_label(e) for e in plan.environments if e.env.needs_gpu}
    gpu_groups = sum(len(groups[e]) for e in gpu_envs)
    count = min(count, sum(len(g) for g in groups.values()))
    # How many bins may take GPU environments (they need GPU machines): all of them when every
    # environment needs one, else the number that gives the shortest longest shard (fewest on ties).
    if not gpu_envs:
        options = [0]
    elif len(gpu_envs) == len(groups) or count == 1:
        options = [count]
    else:
        options = list(range(1, min(count - 1, gpu_groups) + 1))
    best: list[_Bin] | None = None
    for n_gpu in options:
        kinds = [False] * (count - n_gpu) + [True] * n_gpu
        bins = _pack(groups, gpu_envs, kinds, costs.setup_s)
        longest = _makespan(bins, costs.setup_s)
        # Again, moving groups only down to the longest shard: environments that need not be
        # split to reach it stay whole.
        lazy = _pack(groups, gpu_envs, kinds, costs.setup_s, ceiling=longest)
        if _makespan(lazy, costs.setup_s) <= longest + _EPS:
            bins = lazy
        if best is None or _makespan(bins, costs.setup_s) < _makespan(best, costs.setup_s) - _EPS:
            best = bins
    assert best is not None
    order = {label: i for i, label in enumerate(env_label(e) for e in plan.environments)}
    shards = []
    for b in (b for b in best if b.groups):
        ids = {c.cell_id for gs in b.groups.values() for g in gs for c in g.cells}
        envs = [EnvPlan(e.env, [c for c in e.cells if c.cell_id in ids]) for e in plan.environments
                if env_label(e) in b.groups]
        shards.append((b, Plan(plan.matrix, envs)))
    shards.sort(key=lambda s: (any(e.env.needs_gpu for e in s[1].environments),
                               min(order[env_label(e)] for e in s[1].environments),
                               min(c.cell_id for c in s[1].cells)))
    return [Shard(i, len(shards), p, round(b.load(costs.setup_s), 3))
            for i, (b, p) in enumerate(shards, 1)]


def shard_count(plan: Plan, requested: int, min_cells: int = 1) -> int:
    """How many shards to make: at most ``requested``, at most one per export group, and none
    with fewer than ``min_cells`` cells on average (a small matrix stays one job)."""
    if requested < 1:
        raise ConfigError(f"--shards: expected a positive number of shards, got {requested}")
    if min_cells < 1:
        raise ConfigError(f"--min-shard-cells: expected a positive number, got {min_cells}")
    groups = len({(env_label(e), c.group_key) for e in plan.environments for c in e.cells})
    return max(1, min(requested, groups, len(plan.cells) // min_cells))


def pick(shards: list[Shard], index: int, count: int) -> Shard:
    """Shard ``index`` of ``count`` from a split asked for ``count`` shards."""
    if count > len(shards):
        raise ConfigError(f"--shard {index}/{count}: this plan makes at most {len(shards)} shards "
                          f"(more would not shorten the longest one); plan it with --shards {len(shards)}")
    return shards[index - 1]


def shard_plan(plan: Plan, index: int, count: int, costs: Costs | None = None) -> Plan:
    """The cells of shard ``index`` of ``count`` (1-based)."""
    return pick(split_plan(plan, count, costs), index, count).plan


def shard_identity(plan: Plan, shards: list[Shard], index: int) -> dict:
    """What a shard run records in run.json so a merge can check it: which shard, of which plan,
    of which split, and its own cells."""
    mine = shards[index - 1]
    return {"index": index, "count": len(shards), "plan_cells": len(plan.cells),
            "plan_digest": digest(c.cell_id for c in plan.cells),
            "split_digest": split_digest(shards), "cells": len(mine.cells),
            "cells_digest": digest(c.cell_id for c in mine.cells),
            "environments": mine.environments}


def split_digest(shards: list[Shard]) -> str:
    return hashlib.sha256(json.dumps([sorted(c.cell_id for c in s.cells) for s in shards])
                          .encode()).hexdigest()[:16]


def balance(shards: list[Shard]) -> dict[str, float]:
    """Largest shard over the mean shard, in estimated seconds (1.0: perfect)."""
    loads = [s.estimated_s for s in shards]
    mean = math.fsum(loads) / len(loads)
    return {"largest_s": max(loads), "mean_s": round(mean, 3),
            "ratio": round(max(loads) / mean, 4) if mean else 1.0}
