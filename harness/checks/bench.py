"""Benchmarks of the tool itself: latency accuracy and spread, matrix phases, environment reuse.

`nox -s bench` (``python -m harness bench``) writes reports/bench/bench-<timestamp>.json and
prints tables; numbers quoted in docs and issue notes come from here, never from timed
assertions in tests. In one run:

- latency accuracy: the harness's median (runtime adapter + adaptive protocol, as a matrix cell
  records it) against a bare ONNX Runtime loop and against OpenVINO's ``benchmark_app``, on a
  millisecond-scale convnet and on a micro model, each measured in ``REPEATS`` fresh processes
  (interleaved), with the run-to-run spread of the process medians and the binding floor;
- a small matrix (bench.yaml, ``--only``) run twice: wall time, verdict phase vs latency phase,
  whether the re-run gives the same verdicts;
- warm environment reuse and the latency loop's own floor (a no-op).
"""
from __future__ import annotations

import json
import re
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
from harness.core.record import Record, read_records
from harness.core.status import Stage
from harness.envs.provider import harness_process_env
from harness.envs.venv import VenvProvider
from harness.matrix.config import load_matrix
from harness.matrix.plan import build_plan
from harness.matrix.rules import ConfigError, parse_only
from harness.run.latency import measure

BENCH_MATRIX = Path(__file__).with_name("bench.yaml")
REPEATS = 5                   # fresh processes per model and method
BENCHMARK_APP_S = 3           # benchmark_app -t
TARGET = 0.03                 # the targets: medians within ±3 %, spread <= 3 %
NOT_MEASURED = "not measured in this bench run"
VERDICT_STAGES = [s.value for s in Stage if s is not Stage.LATENCY]


# -- latency accuracy -------------------------------------------------------------------------
def latency_env(config: Path, only: str) -> Path:
    """The python of the plan's first environment that has both ort-cpu and openvino."""
    plan = build_plan(load_matrix(config), parse_only(only))
    for env_plan in plan.environments:
        if {"ort-cpu", "openvino"} <= set(env_plan.env.runtimes):
            provider = VenvProvider(log=lambda *a: None)
            provider.ensure(env_plan.env)
            return provider.python(env_plan.env)
    raise ConfigError(f"{config}: no environment with both ort-cpu and openvino (check runtimes and --only)")


def _env_json(python: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run([str(python), "-m", "harness.checks.bench_latency", *args], capture_output=True,
                          text=True, env=harness_process_env(1), check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


_MEDIAN = re.compile(r"Median:\s+([0-9.]+)\s+(ms|us)")


def benchmark_app_median(python: Path, model: str) -> float:
    """OpenVINO's own benchmark tool, configured as a cell is (1 stream, 1 thread, f32, sync)."""
    tool = python.parent / "benchmark_app"
    cmd = [str(tool)] if tool.exists() else [str(python), "-m", "openvino.tools.benchmark.main"]
    cmd += ["-m", model, "-d", "CPU", "-hint", "none", "-nstreams", "1", "-nthreads", "1",
            "-infer_precision", "f32", "-api", "sync", "-t", str(BENCHMARK_APP_S)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=harness_process_env(1))
    found = _MEDIAN.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"benchmark_app failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-800:]}")
    value = float(found.group(1))
    return value / 1e3 if found.group(2) == "us" else value


def spread(values: list[float]) -> float:
    """Run-to-run spread of medians: (max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def bench_latency_accuracy(python: Path, repeats: int = REPEATS) -> dict[str, Any]:
    methods = {
        "harness ort-cpu": lambda m: _env_json(python, "harness", m, "ort-cpu"),
        "bare ort loop": lambda m: _env_json(python, "bare-ort", m),
        "harness openvino": lambda m: _env_json(python, "harness", m, "openvino"),
        "benchmark_app": lambda m: {"median_ms": benchmark_app_median(python, m)},
    }
    out: dict[str, Any] = {"repeats": repeats, "threads": 1, "python": str(python)}
    with tempfile.TemporaryDirectory(prefix="harness-bench-models-") as tmp:
        models = _env_json(python, "models", tmp)
        for name, model in models.items():
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            for _ in range(repeats):           # interleaved: slow drift of the host hits all alike
                for method, run in methods.items():
                    runs[method].append(run(model))
            out[name] = summarize_accuracy(runs)
    return out


def summarize_accuracy(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {m: [r["median_ms"] for r in rs] for m, rs in runs.items()}
    mid = {m: statistics.median(v) for m, v in medians.items()}
    harness = [r for m in ("harness ort-cpu", "harness openvino") for r in runs[m]]
    return {
        "median_ms": {m: round(v, 5) for m, v in mid.items()},
        "process_medians_ms": {m: [round(x, 5) for x in v] for m, v in medians.items()},
        "spread": {m: round(spread(v), 4) for m, v in medians.items()},
        "ratio_harness_ort_vs_bare": round(mid["harness ort-cpu"] / mid["bare ort loop"], 4),
        "ratio_harness_openvino_vs_benchmark_app": round(mid["harness openvino"] / mid["benchmark_app"], 4),
        "floor_ms": {m: statistics.median(r["floor_ms"] for r in runs[m] if r.get("floor_ms") is not None)
                     for m in ("harness ort-cpu", "harness openvino")},
        "harness_stops": sorted({r["stop"] for r in harness}),
        "harness_iterations": [r["iterations"] for r in harness],
        "harness_measure_s": round(statistics.median(r["measure_s"] for r in harness), 3),
    }


# -- a small matrix, twice ---------------------------------------------------------------------
def phases(records: list[Record]) -> dict[str, float]:
    """Verdict phase (export and check once per export group, then load/run/parity per cell) and
    latency phase, summed from the records' stage times."""
    groups: dict[tuple, float] = {}
    cells = latency = 0.0
    for r in records:
        group = (r.torch, r.case, r.exporter, r.opset, r.key.options.label)
        groups[group] = sum(r.duration_s.get(s, 0.0) for s in (Stage.EXPORT.value, Stage.CHECK.value))
        cells += sum(r.duration_s.get(s, 0.0) for s in VERDICT_STAGES
                     if s not in (Stage.EXPORT.value, Stage.CHECK.value))
        latency += r.duration_s.get(Stage.LATENCY.value, 0.0)
    return {"verdict_phase_s": round(sum(groups.values()) + cells, 2), "latency_phase_s": round(latency, 2)}


def bench_matrix_run(config: Path, only: str, out: Path) -> tuple[dict[str, Any], list[Record]]:
    """Run a small real matrix; report wall time, phases, peak RSS of the workers."""
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([sys.executable, "-m", "harness", "matrix", "--config", str(config),
                    "--output", str(out), "--only", only], check=True, capture_output=True)
    wall = time.perf_counter() - t0
    peak_kb = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    records = read_records(out / "results.jsonl")
    lat = [r.latency_ms for r in records if r.latency_ms]
    stats = {
        "cells": len(records), "wall_s": round(wall, 2), "per_cell_s": round(wall / max(len(records), 1), 3),
        **phases(records),
        "peak_worker_rss_mb": round(peak_kb / 1024, 1),
        "results_kb": round((out / "results.jsonl").stat().st_size / 1024, 1),
        "largest_record_kb": round(max((len(r.to_json()) for r in records), default=0) / 1024, 1),
        "latency_stops": {s: sum(1 for x in lat if x.stop == s) for s in sorted({x.stop for x in lat if x.stop})},
        "latency_cv_median": round(statistics.median(x.cv for x in lat), 4) if lat else None,
    }
    return stats, records


def bench_matrix_twice(config: Path, only: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        first, rec1 = bench_matrix_run(config, only, Path(tmp) / "first")
        again, rec2 = bench_matrix_run(config, only, Path(tmp) / "again")
    verdicts = lambda recs: {r.cell_id: (r.status.value, r.stage) for r in recs}  # noqa: E731
    return {"first": first, "warm_rerun": again,
            "warm_rerun_ratio": round(again["wall_s"] / first["wall_s"], 3),
            "same_verdicts": verdicts(rec1) == verdicts(rec2),
            "cold_full_matrix": NOT_MEASURED + " (needs a fresh clone and every torch download)"}


# -- environments and the loop's own floor -------------------------------------------------------
def bench_env_reuse(config: Path, only: str, repeats: int = 5) -> dict[str, Any]:
    """Time VenvProvider.ensure on environments that already exist (the warm path)."""
    provider = VenvProvider(log=lambda *a: None)
    plan = build_plan(load_matrix(config), parse_only(only))
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


def bench_timing_overhead() -> dict[str, Any]:
    """Cost of the latency protocol's own loop, timing a no-op (the floor of any measurement)."""
    res = measure(lambda: None, LatencyProtocol())
    return {"noop_median_us": round(res.median * 1e3, 3), "iterations": res.iterations}


# -- output ---------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.1f} %"


def accuracy_rows(acc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for model in ("convnet", "micro"):
        a = acc[model]
        m, s, f = a["median_ms"], a["spread"], a["floor_ms"]
        rows.append([model, f"{m['harness ort-cpu']:.4g}", f"{m['bare ort loop']:.4g}",
                     _pct(a["ratio_harness_ort_vs_bare"]), f"{m['harness openvino']:.4g}",
                     f"{m['benchmark_app']:.4g}", _pct(a["ratio_harness_openvino_vs_benchmark_app"]),
                     " / ".join(f"{s[k] * 100:.1f}" for k in ("harness ort-cpu", "bare ort loop",
                                                              "harness openvino", "benchmark_app")),
                     f"{f['harness ort-cpu']:.2g} / {f['harness openvino']:.2g}"])
    return rows


def run_bench(config: Path, only: str, reports: Path) -> int:
    """``python -m harness bench``: run every benchmark, print tables, keep the numbers."""
    parse_only(only)
    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "env_reuse": bench_env_reuse(config, only),
        "latency_accuracy": bench_latency_accuracy(latency_env(config, only)),
        "matrix": bench_matrix_twice(config, only),
        "timing_floor": bench_timing_overhead(),
    }
    out_dir = reports / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2))
    acc = results["latency_accuracy"]
    print(f"Latency, median of {acc['repeats']} fresh processes each (ms, 1 thread); targets for "
          f"models >= 1 ms: within ±{TARGET:.0%} of the bare loop and benchmark_app, spread <= {TARGET:.0%}\n")
    print(tabulate(accuracy_rows(acc), tablefmt="github", headers=[
        "model", "harness ort", "bare ort", "ratio", "harness ov", "benchmark_app", "ratio",
        "spread % (h-ort / bare / h-ov / bapp)", "floor ms (ort / ov)"]))
    mx = results["matrix"]
    rows = [[f"env reuse: {k}", f"{v['warm_ensure_ms']:.1f} ms (cold install {v['cold_install_s']} s)"]
            for k, v in results["env_reuse"].items()]
    rows += [[f"matrix ({only}), first run: {k}", v] for k, v in mx["first"].items()]
    rows += [[f"matrix ({only}), warm re-run: {k}", v] for k, v in mx["warm_rerun"].items()]
    rows += [["matrix: warm re-run / first run", mx["warm_rerun_ratio"]],
             ["matrix: same verdicts on re-run", mx["same_verdicts"]],
             ["full matrix, cold vs warm", mx["cold_full_matrix"]]]
    rows += [[f"latency loop floor: {k}", v] for k, v in results["timing_floor"].items()]
    print("\n" + tabulate(rows, headers=["benchmark", "value"], tablefmt="github"))
    print(f"\nwritten to {path}")
    return 0
