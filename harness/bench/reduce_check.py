"""The reduction in warm processes against fresh ones (``--part reduce``).

Polygraphy's ``debug reduce`` asks a check of every candidate graph. The check server
(``harness.worker.diagnose.reduce.CheckServer``) imports onnx, numpy and the runtime once and forks
a copy of itself per check, the pass host (``PassHost``) does the same per Polygraphy pass;
``HARNESS_WORKER_FORK=0`` turns both off, every check and pass then being a fresh interpreter.
Here the failing cells of ``harness/matrices/bench_reduce.yaml`` are reduced both ways,
alternating (the order swapped every repeat): the reduction's seconds, and whether both ways
reduced to the same graph (node count and operators).
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from harness.bench.runs import bench_matrix_run
from harness.core.wire import FORK_ENV

REDUCE_MATRIX = Path(__file__).resolve().parents[1] / "matrices" / "bench_reduce.yaml"
SIDES = {"fresh processes": "0", "check server and pass host": "1"}


def bench_reduce(repeats: int = 3, timeout_s: float = 900.0) -> dict[str, Any]:
    from harness.run.post.reduction import eligible, reduce_run

    out: dict[str, Any] = {"repeats": repeats}
    with tempfile.TemporaryDirectory(prefix="bench-reduce-") as store:
        stats, records = bench_matrix_run(REDUCE_MATRIX, "", Path(store), "--fresh")
        run_dir = Path(stats["run_dir"])
        cells = [r.cell_id for r in records if eligible(r) is None]
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {s: [] for s in SIDES} for c in cells}
        before = os.environ.get(FORK_ENV)
        try:
            for i in range(repeats):
                for side in (list(SIDES) if i % 2 == 0 else list(SIDES)[::-1]):
                    os.environ[FORK_ENV] = SIDES[side]
                    for cell, outcome in reduce_run(run_dir, cells, timeout_s, log=lambda *_: None).items():
                        runs[cell][side].append(outcome)
        finally:
            if before is None:
                os.environ.pop(FORK_ENV, None)
            else:
                os.environ[FORK_ENV] = before
    for cell, sides in runs.items():
        seconds = {s: statistics.median(o["seconds"] for o in v) for s, v in sides.items()}
        graphs = {(o["original_nodes"], o["nodes"], tuple(sorted((o.get("ops") or {}).items())))
                  for v in sides.values() for o in v}
        fresh, server = (seconds[s] for s in SIDES)
        out[cell] = {"seconds": seconds, "ratio": round(server / fresh, 3),
                     "per_repeat_s": {s: [o["seconds"] for o in v] for s, v in sides.items()},
                     "same_graph": len(graphs) == 1,
                     "nodes": sorted({f"{g[0]} → {g[1]}" for g in graphs})}
    return out


def rows(result: dict[str, Any]) -> list[list[Any]]:
    out = []
    for cell, r in result.items():
        if cell == "repeats":
            continue
        fresh, server = (r["seconds"][s] for s in SIDES)
        out.append([f"reduction of {cell}: check server and pass host / fresh processes ({result['repeats']} "
                    "alternated repeats, median)",
                    f"{server} s / {fresh} s = {r['ratio']}; same graph both ways: {r['same_graph']} "
                    f"({', '.join(r['nodes'])} nodes)"])
    return out
