"""OpenVINO's compiled models shared by an environment's latency workers (``--part compiled_cache``).

The latency phase times each passing cell in a first worker and again in confirming workers, each a
fresh process (``harness.run.confirm``); they share OpenVINO's model cache
(``Job.compiled_cache``), so a confirming worker loads the compiled model instead of compiling the
file again. Here, per bench model (``harness.worker.bench_latency``: a ms-scale convnet and a
microsecond model), fresh processes each do what a confirming worker does with one OpenVINO cell
(make the adapter, time it with the confirming protocol), without the cache and with one a first
process filled, alternating: the seconds the load took, and the timed medians (the same compiled
graph: their ratio should stay within the spread of fresh processes).
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from harness.bench.env import env_json


def bench_compiled_cache(python: Path, repeats: int = 9) -> dict[str, Any]:
    out: dict[str, Any] = {"repeats": repeats}
    with tempfile.TemporaryDirectory(prefix="harness-bench-compiled-") as tmp:
        models = env_json(python, "models", tmp)
        for name, model in models.items():
            cache = Path(tmp) / f"cache-{name}"
            filled = env_json(python, "ov-load", model, str(cache))     # the first worker: compiles
            runs: dict[str, list[dict[str, Any]]] = {"compiled": [], "from cache": []}
            for _ in range(repeats):
                runs["compiled"].append(env_json(python, "ov-load", model, "-"))
                runs["from cache"].append(env_json(python, "ov-load", model, str(cache)))
            load = {k: statistics.median(r["load_s"] for r in v) for k, v in runs.items()}
            median = {k: statistics.median(r["median_ms"] for r in v) for k, v in runs.items()}
            out[name] = {
                "load_s": {k: round(v, 4) for k, v in load.items()},
                "load_ratio": round(load["from cache"] / load["compiled"], 3),
                "median_ms": {k: round(v, 5) for k, v in median.items()},
                "median_ratio": round(median["from cache"] / median["compiled"], 3),
                "process_medians_ms": {k: [round(r["median_ms"], 5) for r in v] for k, v in runs.items()},
                "first_loaded_from_cache": filled["loaded_from_cache"],
                "all_loaded_from_cache": all(r["loaded_from_cache"] for r in runs["from cache"]),
            }
    return out


def rows(result: dict[str, Any]) -> list[list[Any]]:
    out = []
    for name, r in result.items():
        if name == "repeats":
            continue
        out.append([f"OpenVINO load in a confirming latency worker, {name}: from the cache / compiled "
                    f"({result['repeats']} interleaved pairs of fresh processes)",
                    f"{r['load_s']['from cache']} s / {r['load_s']['compiled']} s = {r['load_ratio']}; "
                    f"timed median {r['median_ms']['from cache']} / {r['median_ms']['compiled']} ms = "
                    f"{r['median_ratio']}; every cached one loaded from the cache: {r['all_loaded_from_cache']}"])
    return out
