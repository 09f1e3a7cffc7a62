"""Benchmarks of the tool itself: latency accuracy and spread, matrix phases, environment reuse.

`nox -s bench` (``python -m harness bench``) writes reports/bench/bench-<timestamp>.json and
prints tables; numbers quoted in docs and issue notes come from here, never from timed
assertions in tests. In one run:

- latency accuracy: the harness's median (runtime adapter + adaptive protocol, as a matrix cell
  records it) against a bare ONNX Runtime loop and against OpenVINO's ``benchmark_app``, on a
  millisecond-scale convnet and on a micro model, each measured in ``REPEATS`` fresh processes
  (interleaved), with the run-to-run spread of the process medians and the binding overhead;
- a small matrix (bench.yaml, ``--only``) run four times into a temporary store: first run vs
  a re-run served by the cell cache (wall-time ratio, same verdicts), and ``--fresh`` with
  ``--jobs 1`` vs ``--jobs 2`` (verdict phase and latency phase wall times, speed-up of parallel
  verdicts, same verdicts);
- warm environment reuse and the latency loop's own overhead (timing a no-op);
- loading and planning a matrix of 10,000 and 100,000 case entries (seconds, growth).
- the blame ladder's cost (``blame_cost``): seconds per failing cell, nothing on passing cells.
  ``python -m harness.bench.suite blame-cost RUN_DIR`` prints it for any finished run.
- blame accuracy (``blame_accuracy``): the labelled failing cells' matrix (``blame_labels.yaml``)
  run fresh, its blames' party, repository, layer and kind scored against
  ``tests/fixtures/blame_labels.jsonl``, and the layer experiments' seconds per failing cell;
- the gate's interleaved latency comparison (``bench_interleaved``): false "slower" on equal
  files and detection of a 1.3x file, quiet and with one core kept busy, and its seconds;
- the default matrix (``bench_breakdown``): matrix.yaml cold and warm, each broken down
  (environments, export by exporter, check, blame, latency and its share, rendering), and capture
  reuse against the per-opset export measured side by side in one process per torch release;
- process isolation (``harness.worker.group_process``): the start cost of a group's process forked from the
  warm worker, against a group run in the long-lived worker and a cold ``python -c "import
  torch"``, and the small matrix's verdict phase with a fresh process per group against the
  long-lived worker (``HARNESS_WORKER_FORK=0``), same verdicts asked of both.
- process starts with an environment's bytecode and without it, interleaved
  (``harness.bench.bytecode``): the verdict worker, the latency worker and the runner.
- OpenVINO's load in a confirming latency worker, compiled against taken from the model cache the
  first worker filled, interleaved (``harness.bench.compiled_cache``): seconds and timed medians.
- a failing cell's reduction with the check server and pass host against fresh processes, alternated
  (``harness.bench.reduce_check``): seconds and whether both found the same graph.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.bench.blame_accuracy import rows as blame_rows
from harness.bench.env import env_json
from harness.bench.runs import VERDICT_STAGES, bench_matrix_run
from harness.core.job import LatencyProtocol
from harness.core.record import Record, read_records
from harness.core.status import Stage
from harness.core.wire import FORK_ENV
from harness.envs.provider import harness_process_env
from harness.envs.venv import VenvProvider
from harness.matrix.config import load_matrix
from harness.matrix.plan import build_plan
from harness.matrix.rules import ConfigError, parse_only
from harness.worker.latency import measure

BENCH_MATRIX = Path(__file__).resolve().parent.parent / "matrices" / "bench.yaml"
REPEATS = 5                   # fresh processes per model and method
BENCHMARK_APP_S = 3           # benchmark_app -t
TARGET = 0.03                 # the targets: medians within ±3 %, spread <= 3 %
NOT_MEASURED = "not measured in this bench run"


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
        "harness ort-cpu": lambda m: env_json(python, "harness", m, "ort-cpu"),
        "bare ort loop": lambda m: env_json(python, "bare-ort", m),
        "harness openvino": lambda m: env_json(python, "harness", m, "openvino"),
        "benchmark_app": lambda m: {"median_ms": benchmark_app_median(python, m)},
    }
    out: dict[str, Any] = {"repeats": repeats, "threads": 1, "python": str(python)}
    with tempfile.TemporaryDirectory(prefix="harness-bench-models-") as tmp:
        models = env_json(python, "models", tmp)
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
        "binding_overhead_ms": {m: statistics.median(r["binding_overhead_ms"] for r in runs[m]
                                                     if r.get("binding_overhead_ms") is not None)
                     for m in ("harness ort-cpu", "harness openvino")},
        "harness_stops": sorted({r["stop"] for r in harness}),
        "harness_iterations": [r["iterations"] for r in harness],
        "harness_measure_s": round(statistics.median(r["measure_s"] for r in harness), 3),
    }


# -- a small matrix: parallel vs serial verdicts, cold vs cached ------------------------------
def blame_cost(records: list[Record]) -> dict[str, Any]:
    """What the blame ladder cost in a run: per failing cell (its ``duration_s['blame']``, the
    ladder with its reference subprocess and, for exporter-blamed parity failures, the first
    diverging node), and on passing cells (no blame, no time: the hook returns at once)."""
    from harness.worker.diagnose.blame import diagnose

    ran = [r for r in records if not r.cached_from]
    failing = [r for r in ran if r.status.is_failure and r.stage not in (None, "latency")]
    seconds = sorted(r.duration_s["blame"] for r in failing if "blame" in r.duration_s)
    passing = [r for r in ran if r.status.passed]
    verdict = sum(sum(r.duration_s.get(s, 0.0) for s in VERDICT_STAGES) for r in failing)
    probe = passing[0] if passing else None
    hook_us = None
    if probe is not None:   # the hook on a passing record: what every passing cell pays
        t0 = time.perf_counter()
        for _ in range(10000):
            diagnose(None, None, probe)
        hook_us = round((time.perf_counter() - t0) / 10000 * 1e6, 3)
    parties: dict[str, int] = {}
    for r in failing:
        if r.blame:
            parties[r.blame.party] = parties.get(r.blame.party, 0) + 1
    return {
        "failing_cells": len(failing), "blamed": sum(1 for r in failing if r.blame), "parties": parties,
        "blame_s_median": round(statistics.median(seconds), 3) if seconds else None,
        "blame_s_max": round(seconds[-1], 3) if seconds else None,
        "blame_s_total": round(sum(seconds), 2),
        "blame_vs_failing_cells_stage_time": round(sum(seconds) / verdict, 3) if verdict else None,
        "passing_cells": len(passing), "passing_with_blame": sum(1 for r in passing if r.blame or "blame" in r.duration_s),
        "hook_on_passing_cell_us": hook_us,
    }


def verdicts(records: list[Record]) -> dict[str, tuple[str, str | None]]:
    return {r.cell_id: (r.status.value, r.stage) for r in records}


def bench_matrix(config: Path, only: str) -> dict[str, Any]:
    """Four runs of the small matrix into one temporary store: a first run (empty cell cache),
    the same again (every cell from the cache), then --fresh with --jobs 1 and --jobs 2."""
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        store = Path(tmp) / "reports"
        cold, rec_cold = bench_matrix_run(config, only, store)
        warm, rec_warm = bench_matrix_run(config, only, store)
        serial, rec1 = bench_matrix_run(config, only, store, "--fresh", "--jobs", "1")
        parallel, rec2 = bench_matrix_run(config, only, store, "--fresh", "--jobs", "2")
    return {
        "first_run": cold, "cached_rerun": warm,
        "cached_rerun_ratio": round(warm["wall_s"] / cold["wall_s"], 3),
        "cached_same_verdicts": verdicts(rec_warm) == verdicts(rec_cold),
        "jobs_1": serial, "jobs_2": parallel,
        "verdict_phase_speedup_jobs_2": round(serial["verdict_phase_s"] / parallel["verdict_phase_s"], 2)
        if parallel.get("verdict_phase_s") else None,
        "wall_speedup_jobs_2": round(serial["wall_s"] / parallel["wall_s"], 2),
        "jobs_same_verdicts": verdicts(rec1) == verdicts(rec2),
        "blame": blame_cost(rec1),
        "cold_full_matrix": NOT_MEASURED + " (python -m harness matrix on matrix.yaml, see README)",
    }


# -- runtime releases without re-exporting ---------------------------------------------------------
EXTRA_RUNTIME_RELEASES = ["1.18.1", "1.20.1"]


def exports(records: list[Record]) -> int:
    """Export groups this run exported (cells taken from the cache left out)."""
    return len({(r.torch, r.case, r.exporter, r.opset, r.key.options.label) for r in records
                if not r.cached_from and Stage.EXPORT.value in r.duration_s})


def bench_runtime_releases(config: Path, only: str) -> dict[str, Any]:
    """The small matrix run fresh twice: as is, then with two more onnxruntime releases
    (``runtime_versions``) tried on every passing file in runtime-only environments. Exports,
    wall time and the load-and-runs the second run adds (its runtime-only environments built
    beforehand, as a warm .envs/ has them)."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="harness-bench-releases-") as tmp:
        data = yaml.safe_load(config.read_text())
        data["runtime_versions"] = {"ort-cpu": EXTRA_RUNTIME_RELEASES}
        more = Path(tmp) / "releases.yaml"
        more.write_text(yaml.safe_dump(data))
        store = Path(tmp) / "reports"
        plain, rec_plain = bench_matrix_run(config, only, store, "--fresh")
        warm_up, _ = bench_matrix_run(more, only, store, "--fresh")   # builds the runtime-only envs
        releases, rec_releases = bench_matrix_run(more, only, store, "--fresh")
        extra = {}
        for run in sorted((store / "runs").iterdir()):
            meta = json.loads((run / "run.json").read_text())
            extra = meta.get("runtime_releases") or extra
    tried = sum(len(r.graph.get("runtime_versions", {}).get("ort-cpu", {})) for r in rec_releases)
    return {
        "exports_before": exports(rec_plain), "exports_after": exports(rec_releases),
        "wall_s_before": plain["wall_s"], "wall_s_after": releases["wall_s"],
        "wall_s_after_cold_envs": warm_up["wall_s"],
        "cells_with_releases": sum(1 for r in rec_releases if r.graph.get("runtime_versions")),
        "release_checks": tried, "load_and_runs": extra.get("probes"), "floors_pass_s": extra.get("seconds"),
        "same_verdicts": verdicts(rec_plain) == verdicts(rec_releases),
    }


# -- planning a matrix of many cases --------------------------------------------------------------
PLAN_SIZES = (10_000, 100_000)


def bench_plan_scaling(sizes: tuple[int, ...] = PLAN_SIZES) -> dict[str, Any]:
    """Load (YAML, validation, case files) and plan a matrix of N named entries of one case file:
    seconds for each N, and how the time grows with N (10x the entries: ~10x the time is linear)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="harness-bench-plan-") as tmp:
        folder = Path(tmp)
        (folder / "cases.py").write_text("def model():\n    import torch\n"
                                         "    return torch.nn.Linear(2, 2), (torch.zeros(1, 2),)\n")
        for n in sizes:
            path = folder / f"plan-{n}.yaml"
            path.write_text("torch: ['2.13.0']\nexporters: [torchscript]\nopsets: [17]\ncases:\n"
                            + "".join(f"  - {{target: cases.py:model, name: case{i}}}\n" for i in range(n)))
            t0 = time.perf_counter()
            matrix = load_matrix(path)
            t1 = time.perf_counter()
            plan = build_plan(matrix)
            t2 = time.perf_counter()
            out[str(n)] = {"load_s": round(t1 - t0, 3), "plan_s": round(t2 - t1, 3),
                           "total_s": round(t2 - t0, 3), "cells": len(plan.cells),
                           "us_per_entry": round((t2 - t0) / n * 1e6, 1)}
    if len(sizes) >= 2:
        small, large = out[str(sizes[0])], out[str(sizes[-1])]
        out["growth"] = {"entries_x": sizes[-1] / sizes[0],
                         "time_x": round(large["total_s"] / max(small["total_s"], 1e-9), 2)}
    return out
# -- process isolation: a fresh process per export group ------------------------------------------
# Runs in an environment's python: the warm parent's preload, then per "group" (a small
# TorchScript export of a Linear, loaded and run in ONNX Runtime) either in this process (the
# long-lived worker) or in a child forked for it; prints JSON.
ISOLATION_SNIPPET = r"""
import json, os, statistics, sys, tempfile, time
from harness.worker import group_process
t0 = time.perf_counter(); preloaded = group_process.preload(); preload_s = time.perf_counter() - t0
threads = group_process.thread_count()
import torch, onnxruntime as ort
tmp = tempfile.mkdtemp()
def group(i):
    m = torch.nn.Linear(8, 4).eval(); x = torch.randn(2, 8); path = f"{tmp}/g{i}.onnx"
    torch.onnx.export(m, (x,), path, dynamo=False, opset_version=17)
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    s.run(None, {s.get_inputs()[0].name: x.numpy()})
def forked(fn):
    group_process.freeze()                          # as the worker does before each group's fork
    t = time.perf_counter(); r, w = os.pipe(); pid = os.fork()
    if pid == 0:
        os.close(r); os.write(w, repr(time.perf_counter() - t).encode()); fn(); os._exit(0)
    os.close(w); started = float(os.read(r, 64)); os.close(r); os.waitpid(pid, 0)
    return started, time.perf_counter() - t
n = int(sys.argv[1])
start = [forked(lambda: None)[0] for _ in range(n)]
in_fork = [forked(lambda: group(0))[1] for _ in range(n)]
group(-1)                                   # the long-lived worker's first group warms it up
in_place = []
for i in range(n):
    t = time.perf_counter(); group(i); in_place.append(time.perf_counter() - t)
print(json.dumps({"preload_s": preload_s, "preloaded": preloaded, "warm_parent_threads": threads,
                  "fork_start_ms": statistics.median(start) * 1e3,
                  "group_in_fresh_fork_ms": statistics.median(in_fork) * 1e3,
                  "group_in_long_lived_worker_ms": statistics.median(in_place) * 1e3}))
"""


def bench_process_start(python: Path, repeats: int = 10, cold_repeats: int = 3) -> dict[str, Any]:
    """Per-group process start: forked from the warm parent, none (the long-lived worker runs the
    group in place), or a cold interpreter importing torch; medians."""
    env = harness_process_env(1)
    proc = subprocess.run([str(python), "-c", ISOLATION_SNIPPET, str(repeats)], capture_output=True, text=True,
                          env=env, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    cold = []
    for _ in range(cold_repeats):
        t0 = time.perf_counter()
        subprocess.run([str(python), "-c", "import torch"], env=env, check=True, capture_output=True)
        cold.append(time.perf_counter() - t0)
    out["cold_import_torch_ms"] = statistics.median(cold) * 1e3
    out["fork_overhead_per_group_ms"] = out["group_in_fresh_fork_ms"] - out["group_in_long_lived_worker_ms"]
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def bench_isolation(config: Path, only: str) -> dict[str, Any]:
    """The small matrix's verdict phase (``--fresh --jobs 1``) with a fresh process per group and
    with the long-lived worker, and the process start costs in its first environment."""
    plan = build_plan(load_matrix(config), parse_only(only))
    provider = VenvProvider(log=lambda *a: None)
    provider.ensure(plan.environments[0].env)
    start = bench_process_start(provider.python(plan.environments[0].env))
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        store = Path(tmp) / "reports"
        old, rec_old = bench_matrix_run(config, only, store, "--fresh", "--jobs", "1",
                                        env={FORK_ENV: "0"})
        new, rec_new = bench_matrix_run(config, only, store, "--fresh", "--jobs", "1")
    return {"process_start": start, "long_lived_worker": old, "fresh_process_per_group": new,
            "verdict_phase_ratio": round(new["verdict_phase_s"] / old["verdict_phase_s"], 3)
            if old.get("verdict_phase_s") else None,
            "same_verdicts": verdicts(rec_old) == verdicts(rec_new),
            "verdicts_that_differ": {c: [v, verdicts(rec_new).get(c)] for c, v in verdicts(rec_old).items()
                                     if verdicts(rec_new).get(c) != v}}


def isolation_rows(iso: dict[str, Any]) -> list[list[Any]]:
    st = iso["process_start"]
    rows = [[f"isolation: {k}", v] for k, v in st.items()]
    for label, key in (("long-lived worker", "long_lived_worker"), ("fresh process per group", "fresh_process_per_group")):
        rows += [[f"isolation: {label}: {k}", iso[key][k]] for k in ("cells", "wall_s", "verdict_phase_s")]
    rows += [["isolation: verdict phase, fresh / long-lived", iso["verdict_phase_ratio"]],
             ["isolation: same verdicts", iso["same_verdicts"]],
             ["isolation: verdicts that differ (long-lived → fresh)", iso["verdicts_that_differ"] or "none"]]
    return rows


# -- environments and the loop's own overhead ---------------------------------------------------
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


def bench_timing_overhead(reads: int = 200) -> dict[str, Any]:
    """Cost of the latency protocol's own loop, timing a no-op (what any measurement includes),
    and of the load probe's reading of its process's own CPU (twice per timed cell): through the
    children files against a scan of every process of the machine, alternated read by read."""
    from harness.core import proctree
    from harness.worker import machine_load

    res = measure(lambda: None, LatencyProtocol())
    children = proctree.children_files
    took = {"children files": [], "scan of /proc": []}
    try:
        for _ in range(reads):
            for way, fn in (("children files", children), ("scan of /proc", lambda pid: None)):
                proctree.children_files = fn
                t0 = time.perf_counter()
                machine_load.own_cpu_s()
                took[way].append(time.perf_counter() - t0)
    finally:
        proctree.children_files = children
    probe = {way: round(statistics.median(v) * 1e3, 3) for way, v in took.items()}
    return {"noop_median_us": round(res.median * 1e3, 3), "iterations": res.iterations,
            "load_probe_read_ms": probe, "processes": sum(1 for e in Path("/proc").iterdir() if e.name.isdigit())}


# -- output ---------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.1f} %"


def accuracy_rows(acc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for model in ("convnet", "micro"):
        a = acc[model]
        m, s, f = a["median_ms"], a["spread"], a["binding_overhead_ms"]
        rows.append([model, f"{m['harness ort-cpu']:.4g}", f"{m['bare ort loop']:.4g}",
                     _pct(a["ratio_harness_ort_vs_bare"]), f"{m['harness openvino']:.4g}",
                     f"{m['benchmark_app']:.4g}", _pct(a["ratio_harness_openvino_vs_benchmark_app"]),
                     " / ".join(f"{s[k] * 100:.1f}" for k in ("harness ort-cpu", "bare ort loop",
                                                              "harness openvino", "benchmark_app")),
                     f"{f['harness ort-cpu']:.2g} / {f['harness openvino']:.2g}"])
    return rows


def run_bench(config: Path, only: str, reports: Path, parts: list[str] | None = None) -> int:
    """``python -m harness bench``: run every benchmark (or ``parts`` of them), print tables,
    keep the numbers."""
    from harness.bench.breakdown import bench_default_matrix, bench_zoo_sample, zoo_rows
    from harness.bench.breakdown import rows as breakdown_rows
    from harness.bench.bytecode import bench_bytecode
    from harness.bench.bytecode import rows as bytecode_rows
    from harness.bench.compiled_cache import bench_compiled_cache
    from harness.bench.compiled_cache import rows as compiled_cache_rows
    from harness.bench.interleaved import bench_interleaved, interleaved_rows
    from harness.bench.latency_protocol import bench_latency_protocol
    from harness.bench.latency_protocol import rows as latency_protocol_rows
    from harness.bench.pipelines import bench_pipelines, pipelines_rows
    from harness.bench.reduce_check import bench_reduce
    from harness.bench.reduce_check import rows as reduce_rows
    from harness.bench.worker_overheads import bench_worker_overheads
    from harness.bench.worker_overheads import rows as worker_overheads_rows

    parse_only(only)
    benchmarks = {
        "env_reuse": lambda: bench_env_reuse(config, only),
        "latency_accuracy": lambda: bench_latency_accuracy(latency_env(config, only)),
        "matrix": lambda: bench_matrix(config, only),
        "timing_overhead": bench_timing_overhead,
        "plan_scaling": bench_plan_scaling,
        "isolation": lambda: bench_isolation(config, only),
        "runtime_releases": lambda: bench_runtime_releases(config, only),
        "interleaved": lambda: bench_interleaved(latency_env(config, only)),
        "pipelines": lambda: bench_pipelines(config, only),
        "blame_accuracy": bench_blame_accuracy,
        "default_matrix": bench_default_matrix,
        "zoo_sample": bench_zoo_sample,
        "bytecode": lambda: bench_bytecode(latency_env(config, only)),
        "compiled_cache": lambda: bench_compiled_cache(latency_env(config, only)),
        "worker_overheads": lambda: bench_worker_overheads(latency_env(config, only)),
        "latency_protocol": bench_latency_protocol,
        "reduce": bench_reduce,
    }
    unknown = sorted(set(parts or ()) - set(benchmarks))
    if unknown:
        raise ConfigError(f"--part: no benchmark {', '.join(unknown)} (expected {', '.join(benchmarks)})")
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for name, run in benchmarks.items():
        if not parts or name in parts:
            results[name] = run()
    out_dir = reports / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2))
    if "latency_accuracy" in results:
        acc = results["latency_accuracy"]
        print(f"Latency, median of {acc['repeats']} fresh processes each (ms, 1 thread); targets for "
              f"models >= 1 ms: within ±{TARGET:.0%} of the bare loop and benchmark_app, spread <= {TARGET:.0%}\n")
        print(tabulate(accuracy_rows(acc), tablefmt="github", headers=[
            "model", "harness ort", "bare ort", "ratio", "harness ov", "benchmark_app", "ratio",
            "spread % (h-ort / bare / h-ov / bapp)", "binding overhead ms (ort / ov)"]))
    rows = [[f"env reuse: {k}", f"{v['warm_ensure_ms']:.1f} ms (cold install {v['cold_install_s']} s)"]
            for k, v in results.get("env_reuse", {}).items()]
    if "matrix" in results:
        rows += matrix_rows(results["matrix"], only)
    overhead = dict(results.get("timing_overhead", {}))
    probe, processes = overhead.pop("load_probe_read_ms", None), overhead.pop("processes", None)
    rows += [[f"latency loop overhead: {k}", v] for k, v in overhead.items()]
    if probe:
        rows += [[f"load probe, its process's CPU read: children files / a scan of /proc ({processes} processes, "
                  "alternated)", f"{probe['children files']} ms / {probe['scan of /proc']} ms"]]
    scaling = results.get("plan_scaling", {})
    rows += [[f"plan of {int(n):,} case entries", f"{v['total_s']} s (load {v['load_s']} s, plan {v['plan_s']} s, "
              f"{v['us_per_entry']} µs per entry)"] for n, v in scaling.items() if n != "growth"]
    if "growth" in scaling:
        rows += [["plan: time growth for 10x the entries (linear: ~10)", scaling["growth"]["time_x"]]]
    if "isolation" in results:
        rows += isolation_rows(results["isolation"])
    rows += [[f"two more onnxruntime releases ({', '.join(EXTRA_RUNTIME_RELEASES)}): {k}", v]
             for k, v in results.get("runtime_releases", {}).items()]
    if "interleaved" in results:
        rows += interleaved_rows(results["interleaved"])
    if "pipelines" in results:
        rows += pipelines_rows(results["pipelines"])
    if "blame_accuracy" in results:
        rows += blame_rows(results["blame_accuracy"]["score"], results["blame_accuracy"]["cost"])
    if "default_matrix" in results:
        rows += breakdown_rows(results["default_matrix"])
    if "zoo_sample" in results:
        rows += zoo_rows(results["zoo_sample"])
    if "bytecode" in results:
        rows += bytecode_rows(results["bytecode"])
    if "compiled_cache" in results:
        rows += compiled_cache_rows(results["compiled_cache"])
    if "worker_overheads" in results:
        rows += worker_overheads_rows(results["worker_overheads"])
    if "latency_protocol" in results:
        rows += latency_protocol_rows(results["latency_protocol"])
    if "reduce" in results:
        rows += reduce_rows(results["reduce"])
    print("\n" + tabulate(rows, headers=["benchmark", "value"], tablefmt="github"))
    print(f"\nwritten to {path}")
    return 0


def bench_blame_accuracy() -> dict[str, Any]:
    """The labelled cells' matrix run fresh; its blames scored against the labels, and what the
    layer experiments cost per failing cell (``harness.bench.blame_accuracy``)."""
    from harness.bench.blame_accuracy import BLAME_MATRIX, layer_cost, load_labels, score

    with tempfile.TemporaryDirectory(prefix="bench-blame-") as store:
        stats, records = bench_matrix_run(BLAME_MATRIX, "torch=2.6.0|2.9.1|2.13.0", Path(store), "--fresh")
    result = score(records, load_labels())
    return {"run": {k: stats[k] for k in ("cells", "wall_s", "verdict_phase_s")},
            "score": result, "cost": layer_cost(records, stats.get("verdict_phase_s"))}


def matrix_rows(mx: dict[str, Any], only: str) -> list[list[Any]]:
    rows = []
    for label, key in (("first run (empty cell cache)", "first_run"), ("re-run (cell cache)", "cached_rerun"),
                       ("--fresh --jobs 1", "jobs_1"), ("--fresh --jobs 2", "jobs_2")):
        rows += [[f"matrix ({only}), {label}: {k}", v] for k, v in mx[key].items() if k not in ("args", "run_dir")]
    return rows + [["matrix: cached re-run / first run (wall)", mx["cached_rerun_ratio"]],
                   ["matrix: same verdicts from the cache", mx["cached_same_verdicts"]],
                   ["matrix: verdict phase speed-up, jobs 2 vs 1", mx["verdict_phase_speedup_jobs_2"]],
                   ["matrix: wall speed-up, jobs 2 vs 1", mx["wall_speedup_jobs_2"]],
                   ["matrix: same verdicts, jobs 2 vs 1", mx["jobs_same_verdicts"]],
                   *[[f"blame (--fresh --jobs 1): {k}", v] for k, v in mx["blame"].items()],
                   ["full matrix, cold vs warm", mx["cold_full_matrix"]]]


if __name__ == "__main__":   # python -m harness.bench.suite blame-cost RUN_DIR
    if len(sys.argv) == 3 and sys.argv[1] == "blame-cost":
        print(json.dumps(blame_cost(read_records(Path(sys.argv[2]) / "results.jsonl")), indent=2))
        sys.exit(0)
    print("usage: python -m harness.bench.suite blame-cost RUN_DIR", file=sys.stderr)
    sys.exit(2)
