"""What post-export pipelines cost (``nox -s bench -- --part pipelines``): a small matrix with
pipelines (bench_pipelines.yaml) run once, and per pipeline the seconds of its steps per export
group and of a cell's verdict stages against the raw pipeline's, measured in the same run; and
that the bench matrix without pipelines (bench.yaml) still plans raw cells only, with ids and
export groups as before (no step, no extra export)."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from harness.core.record import Record
from harness.core.status import Stage

PIPELINES_MATRIX = Path(__file__).resolve().parents[1] / "matrices" / "bench_pipelines.yaml"
GROUP_STAGES = (Stage.EXPORT.value, Stage.CHECK.value, Stage.STEP.value)


def pipeline_costs(records: list[Record]) -> dict[str, Any]:
    """Per pipeline: median step seconds per export group, median verdict seconds per cell (group
    stages included once per cell), and that median over the raw pipeline's."""
    by: dict[str, list[Record]] = {}
    for r in records:
        by.setdefault(r.key.options.pipeline, []).append(r)
    verdict = {name: statistics.median(sum(v for k, v in r.duration_s.items() if k != Stage.LATENCY.value
                                           and k in {s.value for s in Stage}) for r in recs)
               for name, recs in by.items()}
    raw = verdict.get("raw")
    out = {}
    for name, recs in sorted(by.items()):
        steps = [sum(e.get("seconds") or 0.0 for e in ((r.graph or {}).get("pipeline") or {}).get("steps", []))
                 for r in recs]
        out[name] = {"cells": len(recs), "steps": len(((recs[0].graph or {}).get("pipeline") or {}).get("steps", [])),
                     "step_s_median": round(statistics.median(steps), 3),
                     "verdict_s_per_cell_median": round(verdict[name], 3),
                     "vs_raw": round(verdict[name] / raw, 2) if raw else None,
                     "statuses": sorted({r.status.value for r in recs})}
    return out


def raw_unchanged(config: Path, only: str) -> dict[str, Any]:
    """bench.yaml (no pipelines): its plan holds raw cells only, no steps, one group per export."""
    from harness.matrix.config import load_matrix
    from harness.matrix.plan import build_plan
    from harness.matrix.rules import parse_only

    plan = build_plan(load_matrix(config), parse_only(only))
    return {"cells": len(plan.cells), "pipelines": sorted({c.key.options.pipeline for c in plan.cells}),
            "cells_with_steps": sum(1 for c in plan.cells if c.steps),
            "ids_with_pipe": sum(1 for c in plan.cells if "-pipe-" in c.cell_id)}


def bench_pipelines(config: Path, only: str) -> dict[str, Any]:
    """The pipelines matrix run once; each pipeline's step seconds per export."""
    from harness.bench.runs import bench_matrix_run

    with tempfile.TemporaryDirectory(prefix="harness-bench-pipelines-") as tmp:
        stats, records = bench_matrix_run(PIPELINES_MATRIX, only, Path(tmp) / "reports", "--fresh", "--jobs", "1")
    return {"run": {k: stats[k] for k in ("cells", "wall_s", "verdict_stages_s")},
            "per_pipeline": pipeline_costs(records), "without_pipelines": raw_unchanged(config, only)}


def pipelines_rows(res: dict[str, Any]) -> list[list[Any]]:
    rows = [[f"pipelines ({PIPELINES_MATRIX.name}): {k}", v] for k, v in res["run"].items()]
    rows += [[f"pipeline {name}: {k}", v] for name, p in res["per_pipeline"].items() for k, v in p.items()]
    rows += [[f"bench matrix without pipelines: {k}", v] for k, v in res["without_pipelines"].items()]
    return rows
