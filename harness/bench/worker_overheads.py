"""The harness's own costs around the work, each measured both ways and alternated
(``--part worker_overheads``):

- a first latency worker's binding overhead with the identity model the verdict phase kept in the
  spool, against writing its own (which imports onnx): fresh processes in the environment, CPU
  and wall per process;
- a record's event made for the wire: its fields as they are, against ``asdict``'s deep copy (a
  record with a thousand latency samples);
- a group's list of the modules' files at its end (``harness.worker.loaded``) in a process with
  the verdict worker's imports: each module's ``__file__`` remembered, against asked again;
- the runner's read of a worker's process tree (the memory rule, four times a second per worker):
  the children files, against psutil's ``children(recursive=True)`` (a scan of every process).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from harness.bench.bytecode import timed_process
from harness.envs.provider import harness_process_env

_OVERHEAD = ("import sys\n"
             "from pathlib import Path\n"
             "from harness.core.job import LatencyProtocol\n"
             "from harness.runtimes import load_adapter\n"
             "from harness.worker.latency import binding_overhead\n"
             "for name in ('ort-cpu', 'openvino'):\n"
             "    binding_overhead(load_adapter(name), LatencyProtocol(), 1, Path(sys.argv[1]))\n")

_MODULE_FILES = ("import json, sys, time\n"
                 "from harness.worker import group_process, loaded\n"
                 "group_process.preload()\n"
                 "took = {'remembered': [], 'asked again': []}\n"
                 "for _ in range(int(sys.argv[1])):\n"
                 "    for way in took:\n"
                 "        if way == 'asked again':\n"
                 "            saved = dict(loaded._MODULE_FILES); loaded._MODULE_FILES.clear()\n"
                 "        t0 = time.perf_counter(); n = len(list(loaded._module_files()))\n"
                 "        took[way].append(time.perf_counter() - t0)\n"
                 "        if way == 'asked again':\n"
                 "            loaded._MODULE_FILES.update(saved)\n"
                 "print(json.dumps({'modules': n, **{k: sorted(v)[len(v) // 2] for k, v in took.items()}}))\n")


def _alternated(ways: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds of each way, the ways alternated call by call."""
    took: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(rounds):
        for way, fn in ways.items():
            t0 = time.perf_counter()
            fn()
            took[way].append(time.perf_counter() - t0)
    return {w: statistics.median(v) for w, v in took.items()}


def _record_event() -> dict[str, Callable[[], Any]]:
    from harness.core.cell import CellKey
    from harness.core.events import RecordDone
    from harness.core.record import Latency, Record
    from harness.core.status import Status

    rec = Record.for_cell("bench", CellKey("mha", "dynamo", 18, "ort-cpu"), "2.13.0", "env", Status.PASS)
    rec.latency_ms = Latency(median=0.05, samples=[0.05 + i * 1e-6 for i in range(1000)])
    event = RecordDone(pid=1, record=rec.to_dict())
    return {"fields": event.to_dict, "asdict": lambda: {"event": event.kind, **asdict(event)}}


def _tree_reads() -> tuple[dict[str, Callable[[], Any]], subprocess.Popen]:
    import psutil

    from harness.run.processes import _tree

    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print('up', flush=True); time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    root = psutil.Process(proc.pid)
    return {"children files": lambda: _tree(proc.pid),
            "psutil children": lambda: [root, *root.children(recursive=True)]}, proc


def bench_worker_overheads(env_python: Path, repeats: int = 5, rounds: int = 200) -> dict[str, Any]:
    out: dict[str, Any] = {"repeats": repeats, "rounds": rounds}
    env = harness_process_env(1)
    with tempfile.TemporaryDirectory(prefix="bench-identity-") as tmp:
        kept = Path(tmp) / "identity.onnx"
        subprocess.run([str(env_python), "-c", "import sys; from pathlib import Path; "
                        "from harness.runtimes.binding_overhead import keep_identity_model; "
                        "keep_identity_model(Path(sys.argv[1]))", str(kept)], env=env, check=True)
        runs: dict[str, list[tuple[float, float]]] = {"kept": [], "own": []}
        for _ in range(repeats):
            for way, model in (("kept", kept), ("own", Path(tmp) / "missing.onnx")):
                wall, cpu, _ = timed_process(str(env_python), ["-c", _OVERHEAD, str(model)], env)
                runs[way].append((wall, cpu))
        out["identity_model"] = {f"{way}_{k}": round(statistics.median(r[i] for r in v), 3)
                                 for way, v in runs.items() for i, k in enumerate(("wall_s", "cpu_s"))}
    out["record_event_ms"] = {k: round(v * 1e3, 4) for k, v in _alternated(_record_event(), rounds).items()}
    _, _, text = timed_process(str(env_python), ["-c", _MODULE_FILES, str(rounds // 4)], env)
    found = json.loads(text.strip().splitlines()[-1])
    out["module_files_ms"] = {"modules": found.pop("modules"), **{k: round(v * 1e3, 3) for k, v in found.items()}}
    ways, proc = _tree_reads()
    try:
        out["tree_read_ms"] = {k: round(v * 1e3, 3) for k, v in _alternated(ways, rounds).items()}
    finally:
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
    out["processes"] = sum(1 for e in Path("/proc").iterdir() if e.name.isdigit())
    return out


def rows(r: dict[str, Any]) -> list[list[Any]]:
    ident, ev, mods, tree = r["identity_model"], r["record_event_ms"], r["module_files_ms"], r["tree_read_ms"]
    return [
        [f"a first latency worker's binding overhead, the kept identity model / its own (CPU per process, "
         f"{r['repeats']} pairs alternated)", f"{ident['kept_cpu_s']} s / {ident['own_cpu_s']} s "
         f"(wall {ident['kept_wall_s']} s / {ident['own_wall_s']} s)"],
        [f"a record's event for the wire, its fields / asdict (1,000 samples, {r['rounds']} alternated)",
         f"{ev['fields']} ms / {ev['asdict']} ms"],
        [f"a group's module files, remembered / asked again ({mods['modules']} modules, the verdict worker's imports)",
         f"{mods['remembered']} ms / {mods['asked again']} ms"],
        [f"the runner's read of a worker's tree, children files / psutil children ({r['processes']} processes)",
         f"{tree['children files']} ms / {tree['psutil children']} ms"],
    ]
