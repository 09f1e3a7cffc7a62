"""Beyond one machine: deterministic shards of a plan (merging them is ``harness.store.merge``).

A shard is a set of whole export groups (so no export is done twice) dealt round-robin over the
plan's groups in a stable order; every CI job computes the same split from the same matrix.
"""
from __future__ import annotations

import re

from harness.matrix.plan import EnvPlan, Plan
from harness.matrix.rules import ConfigError


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'2/4' → (2, 4), shards counted from 1."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--shard: expected K/N with 1 <= K <= N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def shard_plan(plan: Plan, index: int, count: int) -> Plan:
    """The cells of shard ``index`` of ``count`` (1-based)."""
    keys = sorted({(e.env.name, c.group_key) for e in plan.environments for c in e.cells}, key=repr)
    mine = {k for i, k in enumerate(keys) if i % count == index - 1}
    envs = []
    for e in plan.environments:
        cells = [c for c in e.cells if (e.env.name, c.group_key) in mine]
        if cells:
            envs.append(EnvPlan(e.env, cells))
    return Plan(matrix=plan.matrix, environments=envs)
