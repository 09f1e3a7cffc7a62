"""The latency protocol's time floor, on the default matrix's own files (``--part latency_protocol``).

A latency worker samples each passing cell until the median's interval is within ±``rel_ci`` and at
least ``min_time_s`` has passed. Every timed cell of the default matrix is a microsecond model, so
that floor, not the interval, decides how long a cell is sampled. Here one torch release's cells of
``matrix.yaml`` (``ONLY``) run with their spool kept. Then fresh latency workers run the run's own
first latency job (every passing cell, OpenVINO's compiled models shared as in the run). They
alternate between the previous floor (``PREVIOUS``, 0.1 s) and the current default, ``ROUNDS``
workers of each, and the order flips each round.

Reported, per protocol: the workers' seconds (the median over the rounds: the first worker also
compiles OpenVINO's models); per cell, the median of each protocol's process medians and their
ratio (a bias of the shorter floor shows there); how far one protocol's processes lie apart (what
the confirmation in ``harness.run.confirm`` judges); how often two of its processes agree within
the confirmation's tolerance (``unstable_spread``), and the calls sampled.
"""
from __future__ import annotations

import json
import math
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.bench.breakdown import DEFAULT_MATRIX
from harness.core.job import PHASE_LATENCY, LatencyProtocol

ONLY = "torch=2.13.0"
PREVIOUS = {"min_time_s": 0.1}     # the floor before: every cell sampled for at least 0.1 s
ROUNDS = 4


def kept_run(config: Path, only: str, reports: Path) -> tuple[Path, Any, Any]:
    """Run ``only``'s cells of ``config`` into ``reports`` with the spool kept; the run directory,
    the plan and the venv provider."""
    from harness.envs import make_provider
    from harness.matrix_run import MatrixRequest, check_installable, plan_for
    from harness.run.context import RunRequest
    from harness.run_workflow import run_plan

    req = MatrixRequest(config=config, only=only, reports=reports)
    plan = plan_for(req)
    check_installable(plan, config, "venv")
    run_dir = run_plan(RunRequest(plan.matrix, config, plan, reports, reports / "run", "venv", keep_spool=True))
    return run_dir, plan, make_provider("venv", log=lambda *a, **k: None)


def first_latency_jobs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Each environment's first latency job of the run (the one the full protocol timed)."""
    jobs: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in (run_dir / "jobs").glob("*.json"):
        number = int(path.stem.rsplit("-", 1)[1])
        job = json.loads(path.read_text())
        if job["phase"] == PHASE_LATENCY and (job["env"] not in jobs or number < jobs[job["env"]][0]):
            jobs[job["env"]] = (number, job)
    return {env: job for env, (_, job) in jobs.items()}


def time_worker(command: list[str], env: dict[str, str], job: dict[str, Any], path: Path) -> dict[str, Any]:
    """One fresh latency worker over ``job``: its wall and CPU seconds and each cell's timing."""
    path.write_text(json.dumps(job))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([*command, "--job", str(path)], env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"latency worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
    cells: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        lat = (event.get("record") or {}).get("latency_ms") or {}
        if event.get("event") == "record" and lat.get("median"):
            cells[event["record"]["cell_id"]] = {k: lat.get(k) for k in ("median", "iterations", "loaded")}
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "cells": cells}


def compare(workers: dict[str, list[dict[str, Any]]], tolerance: float) -> dict[str, Any]:
    """Per protocol: seconds, process spread, agreement, calls; between them: the per-cell ratio."""
    cells = sorted(set.intersection(*(set(w["cells"]) for runs in workers.values() for w in runs)))
    out: dict[str, Any] = {"cells": len(cells), "protocols": {}}
    if not cells:
        return out
    central: dict[str, dict[str, float]] = {}
    for name, runs in workers.items():
        medians = {c: [w["cells"][c]["median"] for w in runs] for c in cells}
        central[name] = {c: statistics.median(v) for c, v in medians.items()}
        spread = [(max(v) - min(v)) / statistics.median(v) for v in medians.values()]
        pairs = [abs(math.log(a / b)) for v in medians.values() for i, a in enumerate(v) for b in v[i + 1:]]
        out["protocols"][name] = {
            "workers": len(runs),
            "wall_s": round(statistics.median(w["wall_s"] for w in runs), 2),
            "cpu_s": round(statistics.median(w["cpu_s"] for w in runs), 2),
            "process_spread_median": round(statistics.median(spread), 4),
            "process_spread_p90": round(statistics.quantiles(spread, n=10)[8], 4) if len(spread) > 1 else None,
            "pairs_agreeing": round(sum(p <= math.log1p(tolerance) for p in pairs) / len(pairs), 3) if pairs else None,
            "iterations_median": statistics.median(w["cells"][c]["iterations"] for w in runs for c in cells),
            "loaded": sum(1 for w in runs for c in cells if w["cells"][c]["loaded"]),
        }
    new, old = list(workers)[-1], list(workers)[0]
    ratio = [central[new][c] / central[old][c] for c in cells]
    q = statistics.quantiles(ratio, n=20) if len(ratio) > 1 else [ratio[0]] * 19
    out["median_ratio"] = {"median": round(statistics.median(ratio), 4), "p5": round(q[0], 4),
                           "p95": round(q[-1], 4), "geometric_mean": round(math.exp(statistics.fmean(map(math.log, ratio))), 4)}
    out["wall_ratio"] = round(out["protocols"][new]["wall_s"] / out["protocols"][old]["wall_s"], 3)
    return out


def bench_latency_protocol(config: Path = DEFAULT_MATRIX, only: str = ONLY, rounds: int = ROUNDS) -> dict[str, Any]:
    """The previous time floor against the default, alternated in fresh latency workers over the
    passing cells of ``only``'s first environment."""
    default = LatencyProtocol()
    protocols = {f"min_time_s {PREVIOUS['min_time_s']} (before)": PREVIOUS,
                 f"min_time_s {default.min_time_s} (default)": {}}
    with tempfile.TemporaryDirectory(prefix="harness-bench-protocol-") as tmp:
        run_dir, plan, provider = kept_run(config, only, Path(tmp) / "reports")
        env_plan = plan.environments[0]
        job = first_latency_jobs(run_dir)[env_plan.env.name]
        command = provider.worker_command(env_plan.env)
        env = provider.worker_env(env_plan.env, job.get("threads") or 1)
        workers: dict[str, list[dict[str, Any]]] = {name: [] for name in protocols}
        for r in range(rounds):
            order = list(protocols) if r % 2 == 0 else list(protocols)[::-1]
            for name in order:
                timed = {**job, "latency": {**job["latency"], **protocols[name]}, "bundles": False, "floor": False}
                workers[name].append(time_worker(command, env, timed, Path(tmp) / "job.json"))
    return {"only": only, "environment": env_plan.env.name, "rounds": rounds,
            **compare(workers, default.unstable_spread)}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    out = []
    for name, p in result.get("protocols", {}).items():
        out.append([f"latency protocol {name}: a first latency worker over {result['cells']} cells "
                    f"({result['environment']}, median of {p['workers']})",
                    f"{p['wall_s']} s ({p['cpu_s']} CPU-s), {p['iterations_median']:.0f} calls per cell; "
                    f"processes apart (max-min)/median {p['process_spread_median']:.1%} (p90 "
                    f"{p['process_spread_p90'] or 0:.1%}); pairs within the confirmation's tolerance "
                    f"{p['pairs_agreeing'] or 0:.0%}; loaded {p['loaded']}"])
    if "median_ratio" in result:
        m = result["median_ratio"]
        out.append(["latency protocol: default / before, per cell, median of the process medians",
                     f"median {m['median']}, p5 {m['p5']}, p95 {m['p95']}, geometric mean {m['geometric_mean']}; "
                     f"worker seconds {result['wall_ratio']}"])
    return out
