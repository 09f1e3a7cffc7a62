"""The environment side of the bench's latency comparison: one measurement per process.

Run with an environment's python (the checkout on PYTHONPATH), printing one JSON line:

    python -m harness.worker.bench_latency models DIR            # write the bench models
    python -m harness.worker.bench_latency harness MODEL RUNTIME  # the harness protocol + adapter
    python -m harness.worker.bench_latency bare-ort MODEL         # a plain onnxruntime loop
    python -m harness.worker.bench_latency ab-models DIR         # spools of the A/B bench's files
    python -m harness.worker.bench_latency ov-load MODEL CACHE|-  # OpenVINO: load, then a confirming timing

Imports what a worker may (standard library, numpy, the harness's worker-side modules); onnx and
onnxruntime lazily. The bare loop uses no harness code at all.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

THREADS = 1
BARE_WARMUP_S = 1.0
BARE_TIME_S = 3.0


def convnet(path: Path, size: int = 96) -> Path:
    """Three 3x3 convolutions (3→32→32→32) on a 96x96 image, pooling and a linear head: about
    1–2 ms at one thread on a current x86 core, the scale where timing noise is small."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    init = lambda name, a: numpy_helper.from_array(a.astype(np.float32), name)
    nodes, inits, x, c_in = [], [], "x", 3
    for i in range(3):
        inits += [init(f"w{i}", rng.standard_normal((32, c_in, 3, 3)) * 0.1), init(f"b{i}", np.zeros(32))]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, c_in = f"r{i}", 32
    inits += [init("wf", rng.standard_normal((32, 10)) * 0.1), init("bf", np.zeros(10))]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["y"])]
    graph = helper.make_graph(nodes, "convnet",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


def micro(path: Path) -> Path:
    """y = relu(x @ W + b) on 16 values: microseconds, dominated by the binding's call overhead."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(16, dtype=np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "micro", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


def mlp(path: Path, layers: int = 10, width: int = 256, batch: int = 8, producer: str = "bench") -> Path:
    """``layers`` MatMul+Relu of ``width`` on a batch of ``batch``: a few hundred microseconds at
    one thread; 13 layers time about 1.3x 10 (the interleaved A/B bench and tests)."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(3)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / width ** 0.5).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits)
    model = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


AB_MODELS = {"base": {"layers": 10, "producer": "torch 1"}, "twin": {"layers": 10, "producer": "torch 2"},
             "slow": {"layers": 13, "producer": "torch 2"}}


def ab_models(folder: Path) -> dict[str, str]:
    """Spool folders of three files: ``base``, ``twin`` (byte-different, the same graph: as fast)
    and ``slow`` (three more layers: about 1.3x slower); name → folder."""
    from harness.worker.spool import write_spool

    out = {}
    for name, kw in AB_MODELS.items():
        spool = Path(folder) / name
        spool.mkdir(parents=True, exist_ok=True)
        mlp(spool / "model.onnx", **kw)
        write_spool(spool, "model.onnx", random_feeds([("x", [8, 256])]))
        out[name] = str(spool)
    return out


def random_feeds(names_shapes: list[tuple[str, list[int]]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {n: rng.standard_normal(shape).astype(np.float32) for n, shape in names_shapes}


def _input_shapes(model: Path) -> list[tuple[str, list[int]]]:
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    return [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in graph.input]


def harness_latency(model: Path, runtime: str) -> dict[str, Any]:
    """What a matrix cell records: the runtime adapter's timed call under the default protocol."""
    from harness.core.job import LatencyProtocol
    from harness.runtimes import load_adapter
    from harness.worker.latency import binding_overhead, measure

    adapter_cls = load_adapter(runtime)
    feeds = random_feeds(_input_shapes(model))
    protocol = LatencyProtocol()
    with adapter_cls(model, threads=THREADS) as adapter:
        t0 = time.perf_counter()
        lat = measure(adapter.timed_call(feeds), protocol, THREADS)
        took = time.perf_counter() - t0
    return {"median_ms": lat.median, "ci_low": lat.ci_low, "ci_high": lat.ci_high, "stop": lat.stop,
            "iterations": lat.iterations, "warmup_iterations": lat.warmup_iterations,
            "cv": lat.cv, "spread": lat.spread, "unstable": lat.unstable, "loaded": lat.loaded,
            "other_cpu": lat.load.get("other_cpu"),
            "measure_s": round(took, 3), "binding_overhead_ms": binding_overhead(adapter_cls, protocol, THREADS)}


def openvino_load(model: Path, cache: str) -> dict[str, Any]:
    """What a confirming latency worker does with one OpenVINO cell: make the adapter (compiling
    the file, or loading it from ``cache``, ``-`` for none) and time it with the confirming
    protocol; the seconds the load took and the median."""
    import openvino  # noqa: F401 - imported before the clock starts, as in a worker

    from harness.core.job import LatencyProtocol
    from harness.runtimes.base import LoadOptions
    from harness.runtimes.openvino import OpenVinoAdapter
    from harness.worker.latency import measure

    feeds = random_feeds(_input_shapes(model))
    load = LoadOptions(compiled_cache=None if cache == "-" else Path(cache))
    t0 = time.perf_counter()
    with OpenVinoAdapter(model, threads=THREADS, load=load) as adapter:
        loaded = time.perf_counter() - t0
        lat = measure(adapter.timed_call(feeds), LatencyProtocol().confirm_protocol(), THREADS)
        cached = adapter.facts.get("loaded_from_cache")
    return {"load_s": round(loaded, 4), "median_ms": lat.median, "loaded_from_cache": cached,
            "loaded": lat.loaded}


def bare_ort_latency(model: Path) -> dict[str, Any]:
    """A plain onnxruntime loop: warm up for a second, time single calls for three, median."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    feeds = random_feeds([(i.name, list(i.shape)) for i in sess.get_inputs()])
    end = time.perf_counter() + BARE_WARMUP_S
    while time.perf_counter() < end:
        sess.run(None, feeds)
    times = []
    end = time.perf_counter() + BARE_TIME_S
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(times) * 1e3, "iterations": len(times)}


def main(argv: list[str]) -> int:
    what, *args = argv
    if what == "ab-models":
        result = ab_models(Path(args[0]))
    elif what == "models":
        out = Path(args[0])
        out.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {"convnet": str(convnet(out / "convnet.onnx")),
                                  "micro": str(micro(out / "micro.onnx"))}
    elif what == "harness":
        result = harness_latency(Path(args[0]), args[1])
    elif what == "bare-ort":
        result = bare_ort_latency(Path(args[0]))
    elif what == "ov-load":
        result = openvino_load(Path(args[0]), args[1])
    else:
        print(f"unknown mode {what!r}: expected models, ab-models, harness, bare-ort or ov-load", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
