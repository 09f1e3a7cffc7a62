"""Worker side of interleaved A/B timing: one process loads several exported files in one runtime
and times them in short rounds, the files in a random order each round, when the runner asks.

Two files that time the same in one process may time 1.5x apart in the next (per-process modes:
memory layout, the core it landed on), while within one process they move together; so the
runner (``harness.run.ab``) compares them round by round inside each process and starts many
fresh ones. Runs in an environment with the runtime (a runtime-only environment, or a cell's
own); imports the runtime's adapter, ``latency`` (the warm-up) and ``machine_load``.

    python -m harness.worker.runtime_only.ab_timer SPEC.json

``SPEC.json``: ``{"runtime", "threads", "seed", "block_s", "block_calls", "warmup": {protocol},
"files": [{"spool", "precision", "options"}]}``. Answers on stdout, one JSON line each, prefixed
``AB `` (a runtime's own output may share the stream):

- once every file is loaded (in a random order) and warmed up: ``{"ready": true, "version",
  "call_ms": [per file]}``, or ``{"ready": false, "error"}`` and it exits;
- per ``round`` line on stdin: ``{"t": [ms per file], "cpu": share}``: per file, the median call
  of a block of at least ``block_calls`` calls and ``block_s`` seconds, in the spec's file order;
  ``cpu``: the share of the round this process (and its children) ran on a CPU (null for a
  runtime on a GPU, whose process waits on the device);
- on ``end`` (or end of input): ``{"load": ...}`` (``LoadProbe`` over every round) and it exits.
"""
from __future__ import annotations

import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from harness.core.wire import AB_PREFIX, AB_TIMER_MODULE


def say(message: dict[str, Any]) -> None:
    sys.stdout.write(AB_PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def block(fn: Callable[[], Any], block_s: float, block_calls: int) -> float:
    """The median call (ms) of at least ``block_calls`` calls lasting at least ``block_s``."""
    self_timed = getattr(fn, "self_timed", False)
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        reported = fn()
        t1 = time.perf_counter()
        times.append(reported if self_timed else t1 - t0)
        if len(times) >= block_calls and t1 - start >= block_s:
            return statistics.median(times) * 1e3


def load(spec: dict[str, Any], rng: random.Random, active: contextlib.ExitStack) -> tuple[list[Callable[[], Any]], str | None]:
    """Every file's timed call (adapters created in a random order, each active until ``active``
    closes), and the runtime's version."""
    from harness.runtimes import load_adapter
    from harness.runtimes.base import match_feeds
    from harness.worker.spool import read_spooled

    adapter_cls = load_adapter(spec["runtime"])
    files = spec["files"]
    calls: list[Any] = [None] * len(files)
    for i in rng.sample(range(len(files)), len(files)):
        spooled = read_spooled(Path(files[i]["spool"]))
        adapter = adapter_cls(spooled.onnx, threads=spec.get("threads"), precision=files[i].get("precision", "fp32"),
                              options=files[i].get("options") or {})
        adapter.prepare(spooled.shapes)
        active.enter_context(adapter)
        calls[i] = adapter.timed_call(match_feeds(spooled.feeds, adapter.input_names()))
    return calls, adapter_cls.version()


def serve(spec: dict[str, Any], commands: Any = None) -> int:
    with contextlib.ExitStack() as active:
        return _serve(spec, commands, active)


def _serve(spec: dict[str, Any], commands: Any, active: contextlib.ExitStack) -> int:
    from harness.core.job import LatencyProtocol
    from harness.runtimes import runtime_info
    from harness.worker.latency import warm_up
    from harness.worker.machine_load import LoadProbe, cpu_clock
    from harness.worker.runtime_only.release_check import runtime_error

    rng = random.Random(spec.get("seed"))
    block_s, block_calls = float(spec.get("block_s", 0.002)), int(spec.get("block_calls", 3))
    try:
        calls, version = load(spec, rng, active)
        protocol = LatencyProtocol.from_dict(spec.get("warmup"))
        for i in rng.sample(range(len(calls)), len(calls)):
            warm_up(calls[i], protocol)
        call_ms = [block(fn, block_s, block_calls) for fn in calls]
    except Exception as exc:  # noqa: BLE001 - a file this runtime cannot load is the runner's to report
        say({"ready": False, "error": runtime_error(exc, Path(spec["files"][0]["spool"]))})
        return 0
    say({"ready": True, "version": version, "call_ms": call_ms})
    # A GPU runtime's process waits on the device: its CPU share says nothing of contention.
    on_gpu = runtime_info(spec["runtime"]).needs_gpu
    clock = cpu_clock()
    probe = LoadProbe.start()
    for line in commands if commands is not None else sys.stdin:
        if line.strip() != "round":
            break
        order = rng.sample(range(len(calls)), len(calls))
        t: list[float] = [0.0] * len(calls)
        c0, w0 = clock(), time.perf_counter()
        for i in order:
            t[i] = block(calls[i], block_s, block_calls)
        share = (clock() - c0) / max(time.perf_counter() - w0, 1e-9)
        say({"t": t, "cpu": None if on_gpu else round(share, 3)})
    say({"load": probe.result()})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {AB_TIMER_MODULE} SPEC.json", file=sys.stderr)
        return 2
    return serve(json.loads(Path(args[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
