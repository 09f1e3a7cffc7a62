"""Process starts with an environment's bytecode and without it, interleaved (``--part bytecode``).

The venv provider compiles an environment's packages when it installs them (``harness.envs.venv``).
Without that, and wherever ``PYTHONDONTWRITEBYTECODE`` is set (this project's CI machines, most
container images), every worker compiles torch's sources again when it starts. Both sides run here
one after the other, in the same environment: "without" points ``PYTHONPYCACHEPREFIX`` at an empty
folder, so Python finds no bytecode and writes none, exactly as in an environment never compiled.

Measured per start: wall seconds and CPU seconds (the child's user + system time), for
- the verdict worker's warm parent (``group_process.preload``: torch, the exporters, the runtimes);
- the latency worker (the harness's worker module and the runtimes, no torch);
- the runner (this interpreter, the report's and the scheduler's modules).
"""
from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.envs.provider import harness_process_env

STARTS = {
    "verdict worker": "from harness.worker import group_process; group_process.preload()",
    "latency worker": "import harness.worker.main, onnxruntime, openvino",
    "runner": "import harness.matrix_run, harness.report.html, harness.report.markdown",
}


def timed_process(python: str, args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """One fresh process (``python`` with ``args``): its wall seconds, CPU seconds and output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([python, *args], env=env, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def _start(python: str, code: str, env: dict[str, str]) -> tuple[float, float]:
    """One fresh process running ``code``: (wall s, CPU s)."""
    return timed_process(python, ["-c", code], env)[:2]


def bench_bytecode(env_python: Path, repeats: int = 3) -> dict[str, Any]:
    """Each start ``repeats`` times with bytecode and without, alternating; medians and ratios."""
    out: dict[str, Any] = {}
    base = harness_process_env(1)
    for what, code in STARTS.items():
        python = sys.executable if what == "runner" else str(env_python)
        runs: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
        for _ in range(repeats):
            runs["with"].append(_start(python, code, base))
            with tempfile.TemporaryDirectory(prefix="bench-no-bytecode-") as empty:
                runs["without"].append(_start(python, code, {**base, "PYTHONPYCACHEPREFIX": empty,
                                                             "PYTHONDONTWRITEBYTECODE": "1"}))
        row = {f"{side}_{k}": round(statistics.median(v[i] for v in runs[side]), 2)
               for side in runs for i, k in enumerate(("wall_s", "cpu_s"))}
        row["cpu_ratio"] = round(row["with_cpu_s"] / row["without_cpu_s"], 3) if row["without_cpu_s"] else None
        out[what] = row
    out["repeats"] = repeats
    return out


def rows(result: dict[str, Any]) -> list[list[Any]]:
    return [[f"process start, {what}: with bytecode / without (CPU, {result['repeats']} interleaved pairs)",
             f"{r['with_cpu_s']} s / {r['without_cpu_s']} s = {r['cpu_ratio']} "
             f"(wall {r['with_wall_s']} s / {r['without_wall_s']} s)"]
            for what, r in result.items() if what != "repeats"]
