"""Beyond one machine: deterministic shards of a plan, and merging shard runs into one run.

A shard is a set of whole export groups (so no export is done twice) dealt round-robin over the
plan's groups in a stable order; every CI job computes the same split from the same matrix.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from harness.config import ConfigError
from harness.plan import EnvPlan, Plan
from harness.records import append_record, read_records
from harness.store import new_run_id, read_run_meta, write_json_atomic


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


def merge_runs(run_dirs: list[Path], output: Path) -> Path:
    """One run from finished shard runs: records concatenated (a cell twice is an error), run.json
    environments unioned, the shards listed; then the usual reports."""
    metas = [read_run_meta(d) for d in run_dirs]
    unfinished = [str(d) for d, m in zip(run_dirs, metas) if not m.get("finished")]
    if unfinished:
        raise ConfigError(f"merge: runs not finished: {', '.join(unfinished)}")
    hashes = {m["matrix_hash"] for m in metas}
    if len(hashes) > 1:
        raise ConfigError(f"merge: shards come from different matrices ({sorted(hashes)})")
    output.mkdir(parents=True, exist_ok=False)
    run_id = new_run_id(hashes.pop())
    seen: dict[str, Path] = {}
    for d in run_dirs:
        for rec in read_records(d / "results.jsonl"):
            if rec.cell_id in seen:
                raise ConfigError(f"merge: cell {rec.cell_id} is in both {seen[rec.cell_id]} and {d}")
            seen[rec.cell_id] = d
            rec.run_id = run_id
            append_record(output / "results.jsonl", rec)
    meta = {**metas[0], "run_id": run_id, "started": min(m["started"] for m in metas),
            "ended": max(m["ended"] for m in metas), "finished": True,
            "environments": {k: v for m in metas for k, v in m["environments"].items()},
            "shards": [{"run_id": m["run_id"], "dir": str(d)} for d, m in zip(run_dirs, metas)],
            "merged": time.time()}
    write_json_atomic(output / "run.json", meta)
    (output / "shards.json").write_text(json.dumps(meta["shards"], indent=2))
    return output
