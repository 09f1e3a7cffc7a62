"""One benchmark run of a real matrix (``bench_matrix_run``) and the stage seconds its records
sum to (``phases``): what every part of the benchmark (``suite``, ``pipelines``, ``breakdown``)
times a matrix with."""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.core.record import Record, read_records
from harness.core.status import Stage

VERDICT_STAGES = [s.value for s in Stage if s is not Stage.LATENCY]


def phases(records: list[Record]) -> dict[str, float]:
    """Stage seconds summed from the records (cells taken from the cache left out): the verdict
    stages (export and check once per export group, then load/run/parity per cell) and latency.
    Worker time, not wall time: with parallel verdicts their wall time is the run's ``schedule``."""
    groups: dict[tuple, float] = {}
    cells = latency = 0.0
    for r in records:
        if r.cached_from:
            continue
        group = (r.torch, r.case, r.exporter, r.opset, r.key.options.label)
        shared = (Stage.EXPORT.value, Stage.CHECK.value, Stage.STEP.value)   # once per export group
        groups[group] = sum(r.duration_s.get(s, 0.0) for s in shared)
        cells += sum(r.duration_s.get(s, 0.0) for s in VERDICT_STAGES if s not in shared)
        latency += r.duration_s.get(Stage.LATENCY.value, 0.0)
    return {"verdict_stages_s": round(sum(groups.values()) + cells, 2), "latency_stages_s": round(latency, 2)}


def bench_matrix_run(config: Path, only: str, reports: Path, *args: str,
                     env: dict[str, str] | None = None) -> tuple[dict[str, Any], list[Record]]:
    """Run a small real matrix into ``reports``; wall time, phases (wall and summed stage time),
    cells taken from the cache, peak RSS of the workers."""
    t0 = time.perf_counter()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "harness", "--reports", str(reports), "matrix",
                           "--config", str(config), *(["--only", only] if only else []), *args], check=True, capture_output=True,
                          text=True, env=None if env is None else {**os.environ, **env})
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The runner's and every worker's CPU (each waits for the processes it starts).
    cpu = usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime
    out = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("run directory: ")))
    peak_kb = max(usage0.ru_maxrss, usage.ru_maxrss)
    records = read_records(out / "results.jsonl")
    schedule = json.loads((out / "run.json").read_text()).get("schedule", {})
    lat = [r.latency_ms for r in records if r.latency_ms and not r.cached_from]
    stats = {
        "args": " ".join(args), "run_dir": str(out), "cells": len(records), "wall_s": round(wall, 2),
        "per_cell_s": round(wall / max(len(records), 1), 3), "cpu_s": round(cpu, 1),
        "jobs": schedule.get("jobs"), "cached": schedule.get("cached"),
        "verdict_phase_s": schedule.get("verdict_phase_s"), "latency_phase_s": schedule.get("latency_phase_s"),
        **phases(records),
        "peak_worker_rss_mb": round(peak_kb / 1024, 1),
        "results_kb": round((out / "results.jsonl").stat().st_size / 1024, 1),
        "largest_record_kb": round(max((len(r.to_json()) for r in records), default=0) / 1024, 1),
        "latency_stops": {s: sum(1 for x in lat if x.stop == s) for s in sorted({x.stop for x in lat if x.stop})},
        "latency_cv_median": round(statistics.median(x.cv for x in lat), 4) if lat else None,
    }
    return stats, records
