"""The bench's interleaved A/B part: the gate's latency comparison on real files, quiet and loaded.

``bench_interleaved`` (``nox -s bench -- --part interleaved``) runs the gate's own comparison of one
cell (``harness.gate.retime.timed``: interleaved A/B timing with the gate's default settings) on
files made by ``harness.worker.bench_latency ab-models`` in the bench environment's ONNX Runtime,
``AB_RUNS`` times per pair: byte-different files of one graph (a "slower" there is a false fail)
and a file with 1.3x the work (it must be found), on a quiet machine and with one core kept busy.
"""
from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from harness.bench.env import env_json
from harness.envs.provider import harness_process_env

AB_RUNS = 20                  # gate comparisons per pair and machine state


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """A process spinning while the block runs: a core's worth of other work, where the kernel
    puts it (pinned, it made timing processes woken on its core share it for most of a round)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def bench_interleaved(python: Path, runs: int = AB_RUNS) -> dict[str, Any]:
    """The gate's latency comparison (``retime.timed``: interleaved A/B timing with the gate's
    default settings) of real files in ONNX Runtime, ``runs`` times per pair, on a quiet machine
    and with one core kept busy: byte-different files of one graph (a false "slower" is a false
    fail) and a file with 1.3x the work (it must be found). Seconds per comparison: its cost.
    Beside it, the first look alone (``stats.compare_intervals`` on two figures each timed in its
    own fresh process with the matrix's protocol), what the gate decided from before."""
    from harness.run.ab import Stack, TimedFile

    env = harness_process_env(1)
    env.pop("VIRTUAL_ENV", None)
    stack = Stack("ort-cpu", str(python), "ort-cpu", env)
    out: dict[str, Any] = {"runs": runs, "settings": "gate defaults (--remeasure 4)", "python": str(python)}
    with tempfile.TemporaryDirectory(prefix="harness-bench-ab-") as tmp:
        files = {k: TimedFile(Path(v)) for k, v in env_json(python, "ab-models", tmp).items()}
        for state in ("quiet", "one core busy"):
            with busy_core() if state != "quiet" else contextlib.nullcontext():
                for pair, cand in (("equal files", "twin"), ("x1.3 file", "slow")):
                    out[f"{state}: {pair}"] = interleaved_pair(files["base"], files[cand], stack, runs)
                    out[f"{state}: {pair}"]["first_look_alone"] = first_look_pair(
                        python, files["base"], files[cand], runs)
    return out


def interleaved_pair(base: Any, cand: Any, stack: Any, runs: int) -> dict[str, Any]:
    """``runs`` gate comparisons of one cell whose stored figures flagged it slower."""
    from harness.core.cell import CellKey
    from harness.core.record import Record
    from harness.core.status import Status
    from harness.gate.compare import CellComparison, Settings, Verdict
    from harness.gate.retime import timed
    from harness.run.ab import ABSettings

    key = CellKey("mlp", "dynamo", 18, "ort-cpu")
    rec = Record.for_cell("r", key, "t", "env", Status.PASS, latency_ms={"median": 0.1})
    cells, seconds = [], []
    for _ in range(runs):
        cell = CellComparison(key, Verdict.SLOWER, rec, rec, "")
        t0 = time.perf_counter()
        timed(cell, [base, cand], [stack], (rec, rec), Settings(), ABSettings())
        seconds.append(time.perf_counter() - t0)
        cells.append(cell)
    ivs = [c.interleaved for c in cells]
    told = [i.main for i in ivs if i.main]
    return {
        "slower": sum(c.verdict is Verdict.SLOWER for c in cells),
        "cannot_tell": sum(c.verdict is Verdict.CANNOT_TELL for c in cells),
        "ratio_median": round(statistics.median(m.ratio for m in told), 4) if told else None,
        "widest_interval": max((round(m.high / m.low, 3) for m in told), default=None),
        "process_sets_median": statistics.median(i.sets for i in ivs),
        "clean_rounds_share": round(sum(i.clean for i in ivs) / max(1, sum(i.rounds for i in ivs)), 3),
        "seconds_per_comparison": round(statistics.median(seconds), 2),
    }


def first_look_pair(python: Path, base: Any, cand: Any, runs: int) -> dict[str, Any]:
    """``runs`` first looks: each file timed in its own fresh process (the matrix's protocol and
    adapter, ``bench_latency harness``), compared by their medians' intervals."""
    from harness.gate.compare import Settings
    from harness.gate.stats import compare_intervals

    slower = 0
    for _ in range(runs):
        a, b = (env_json(python, "harness", str(Path(f.spool) / "model.onnx"), "ort-cpu") for f in (base, cand))
        change = compare_intervals(a["median_ms"], (a["ci_low"], a["ci_high"]), b["median_ms"],
                                   (b["ci_low"], b["ci_high"]), Settings().latency_threshold)
        slower += change.slower
    return {"slower": slower}


def interleaved_rows(ab: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for name, v in ab.items():
        if isinstance(v, dict):
            rows.append([f"interleaved ({ab['runs']} comparisons): {name}",
                         f"slower {v['slower']}/{ab['runs']}, cannot tell {v['cannot_tell']}, ratio "
                         f"{v['ratio_median']}, {v['process_sets_median']} process sets, "
                         f"{v['seconds_per_comparison']} s each, {v['clean_rounds_share']:.0%} rounds clean; "
                         f"first look alone: slower {v['first_look_alone']['slower']}/{ab['runs']}"])
    return rows
