"""Benchmarks of the tool itself: environment reuse, cell throughput, worker memory, timing overhead.

`nox -s bench` writes reports/bench/<timestamp>.json and prints a table; numbers quoted in docs
and issue notes come from here, never from timed assertions in tests.
"""
from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.core.job import LatencyProtocol
from harness.core.record import read_records
from harness.envs.venv import VenvProvider
from harness.matrix.config import load_matrix
from harness.matrix.plan import build_plan
from harness.matrix.rules import parse_only
from harness.run.latency import measure

BENCH_MATRIX = Path(__file__).with_name("bench.yaml")


def bench_env_reuse(config: Path, repeats: int = 5) -> dict[str, Any]:
    """Time VenvProvider.ensure on environments that already exist (the warm path)."""
    provider = VenvProvider(log=lambda *a: None)
    plan = build_plan(load_matrix(config))
    out = {}
    for env_plan in plan.environments:
        provider.ensure(env_plan.env)  # make sure it exists first (not timed)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            info = provider.ensure(env_plan.env)
            times.append(time.perf_counter() - t0)
            assert info.reused
        out[env_plan.env.name] = {"warm_ensure_ms": statistics.median(times) * 1e3,
                                  "cold_install_s": info.install_s}
    return out


def bench_matrix_run(config: Path, only: str) -> dict[str, Any]:
    """Run a small real matrix; report wall time, per-cell overhead beyond export+latency, peak RSS."""
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        out = Path(tmp) / "run"
        t0 = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run([sys.executable, "-m", "harness", "matrix", "--config", str(config),
                        "--output", str(out), "--only", only], check=True, capture_output=True)
        wall = time.perf_counter() - t0
        peak_kb = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        records = read_records(out / "results.jsonl")
    stage_total = sum(sum(r.duration_s.values()) for r in records)
    export_total = sum(r.duration_s.get("export", 0) for r in records)
    lat = [r.latency_ms for r in records if r.latency_ms]
    return {
        "cells": len(records), "wall_s": round(wall, 2),
        "per_cell_s": round(wall / max(len(records), 1), 3),
        "stage_time_s": round(stage_total, 2), "export_time_s": round(export_total, 2),
        "harness_overhead_s": round(wall - stage_total, 2),
        "peak_worker_rss_mb": round(peak_kb / 1024, 1),
        "latency_cv_median": round(statistics.median(l.cv for l in lat), 4) if lat else None,
        "unstable_cells": sum(1 for l in lat if l.unstable),
    }


def bench_timing_overhead() -> dict[str, Any]:
    """Cost of the latency protocol's own loop, timing a no-op (the floor of any measurement)."""
    res = measure(lambda: None, LatencyProtocol(min_runs=2000, min_time_s=0.2))
    return {"noop_median_us": round(res.median * 1e3, 3), "iterations": res.iterations}


def run_bench(config: Path, only: str, reports: Path) -> int:
    """``python -m harness bench``: run every benchmark, print a table, keep the numbers."""
    parse_only(only)
    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "env_reuse": bench_env_reuse(config),
        "matrix": bench_matrix_run(config, only),
        "timing_floor": bench_timing_overhead(),
    }
    out_dir = reports / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2))
    rows = [[f"env reuse: {k}", f"{v['warm_ensure_ms']:.1f} ms (cold install {v['cold_install_s']} s)"]
            for k, v in results["env_reuse"].items()]
    rows += [[f"matrix ({only}): {k}", v] for k, v in results["matrix"].items()]
    rows += [[f"latency loop floor: {k}", v] for k, v in results["timing_floor"].items()]
    print(tabulate(rows, headers=["benchmark", "value"], tablefmt="github"))
    print(f"\nwritten to {path}")
    return 0

