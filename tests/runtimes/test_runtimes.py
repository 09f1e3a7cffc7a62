"""Runtimes behind the runner interface: OpenVINO end to end, availability, CUDA fall-back, TensorRT helpers."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, TESTS, env_python, run_harness, run_matrix

from harness.runtimes import RUNTIMES, gpu_unavailable_reason
from harness.runtimes.base import RuntimeUnavailable

ON_GPU = gpu_unavailable_reason() is None
PROBE_TARGETS = {"mha": "harness.probes.attention:mha", "conv_bn": "harness.probes.vision:conv_bn",
                 "repeat_interleave": "harness.probes.shapes:repeat_interleave"}


# -- OpenVINO end to end --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ov_run(tmp_path_factory) -> Path:
    return run_matrix(tmp_path_factory, "openvino", "openvino.yaml")


@pytest.fixture(scope="module")
def ov_records(ov_run):
    from harness.core.record import read_records

    return read_records(ov_run / "results.jsonl")


@pytest.fixture(scope="module")
def direct_ov(ov_run, ov_records, tmp_path_factory) -> dict[tuple, dict]:
    """Verdicts of tests/direct_openvino.py, run in the matrix's own environment."""
    meta = json.loads((ov_run / "run.json").read_text())
    items = []
    for r in ov_records:
        if r.runtime != "openvino":
            continue
        item = {"case": r.case, "target": PROBE_TARGETS[r.case], "exporter": r.exporter, "opset": r.opset}
        if r.bundle and (Path(r.bundle) / "model.onnx").exists():
            item["model"] = str(Path(r.bundle) / "model.onnx")  # the very file the harness ran
        items.append(item)
    tmp = tmp_path_factory.mktemp("direct")
    (tmp / "cells.json").write_text(json.dumps(items))
    subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "direct_openvino.py"), str(tmp / "cells.json"),
                    str(tmp / "out.jsonl")], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                   capture_output=True, timeout=900)
    rows = [json.loads(line) for line in (tmp / "out.jsonl").read_text().splitlines()]
    return {(d["case"], d["exporter"], d["opset"]): d for d in rows}


@pytest.mark.e2e
def test_every_cell_has_one_record_on_both_cpu_runtimes(ov_records):
    assert len(ov_records) == 3 * 2 * 2 * 2
    assert {r.runtime for r in ov_records} == {"ort-cpu", "openvino"}
    assert len({r.env for r in ov_records}) == 1, "openvino shares the CPU environment with onnxruntime"


@pytest.mark.e2e
def test_openvino_passes_carry_parity_latency_and_precision(ov_records):
    passes = [r for r in ov_records if r.runtime == "openvino" and r.status == "pass"]
    assert len(passes) >= 6, [(r.cell_id, r.error) for r in ov_records if r.runtime == "openvino"]
    for r in passes:
        assert r.parity.max_abs < 1e-4
        assert len(r.parity.shapes) == 2, "dynamic dims are checked at a second shape"
        lat = r.latency_ms
        assert lat.iterations >= 20 and 0 < lat.min <= lat.median <= lat.p90
        facts = r.graph["runtime_facts"]
        # the CPU here supports bf16: without the hint OpenVINO would have used it
        assert facts["precision"] == "fp32" and facts["precision_requested"] == "fp32"
        assert facts["threads"] == 1 and facts["performance_hint"] == "LATENCY"
        assert r.versions["runtime"] == RUNTIMES["openvino"].default_version
        assert r.options["precision"] == "fp32"


@pytest.mark.e2e
def test_openvino_verdicts_match_a_direct_openvino_run(ov_records, direct_ov):
    for r in (r for r in ov_records if r.runtime == "openvino"):
        direct = direct_ov[(r.case, r.exporter, r.opset)]
        assert (r.status, r.stage) == (direct["status"], direct["stage"]), (r.cell_id, r.error, direct)


@pytest.mark.e2e
def test_openvino_load_errors_are_readable(ov_records):
    for r in ov_records:
        if r.runtime == "openvino" and r.stage == "load":
            assert "core.cpp" not in r.error and r.error.startswith("OpenVinoError: "), r.error


# -- availability ---------------------------------------------------------------------------------
def test_missing_packages_give_a_reason(tmp_path):
    """A real environment without any runtime package: each runner says which package is missing."""
    import shutil

    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(tmp_path / "v")], check=True)
    py = tmp_path / "v" / "bin" / "python"
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(py), "numpy"], check=True)
    code = ("import json; from harness.runtimes import load_adapter as L; "
            "print(json.dumps({n: L(n).unavailable_reason() for n in ['openvino', 'ort-cuda', 'tensorrt', 'ort-cpu']}))")
    out = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT)}).stdout
    reasons = json.loads(out)
    assert reasons["openvino"] == "package openvino is not installed in this environment"
    assert reasons["ort-cuda"] == "package onnxruntime-gpu is not installed in this environment"
    assert reasons["tensorrt"] == "package tensorrt is not installed in this environment"
    assert "onnxruntime" in reasons["ort-cpu"]


def test_openvino_available_in_process():
    from harness.runtimes.openvino import OpenVinoAdapter

    assert OpenVinoAdapter.unavailable_reason() is None
    assert OpenVinoAdapter.version() == RUNTIMES["openvino"].default_version


@pytest.mark.skipif(ON_GPU, reason="this machine has an NVIDIA GPU")
def test_no_gpu_reason_is_precise_and_shared():
    from harness.envs.venv import gpu_unavailable_reason as host_reason
    from harness.runtimes.ort_cuda import OrtCudaAdapter

    why = gpu_unavailable_reason()
    assert why == host_reason()
    assert "NVIDIA" in why and ("/dev/nvidia" in why or "libcuda" in why or "driver" in why)
    # onnxruntime (CPU) is installed here: the GPU is what is missing, and that is what is said
    assert OrtCudaAdapter.unavailable_reason() == why
    with pytest.raises(RuntimeUnavailable, match="NVIDIA"):
        OrtCudaAdapter(Path("unused.onnx")).activate()


@pytest.mark.e2e
@pytest.mark.skipif(ON_GPU, reason="this machine has an NVIDIA GPU")
def test_gpu_matrix_cells_are_skips_with_the_reason_and_gpu_check_exits_0(tmp_path):
    proc = run_harness("gpu-check", "--output", str(tmp_path / "run"), check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    from harness.core.record import read_records

    records = read_records(tmp_path / "run" / "results.jsonl")
    assert records and {r.runtime for r in records} == {"ort-cuda", "tensorrt"}
    assert all(r.status == "skip" and r.reason == gpu_unavailable_reason() for r in records)
    assert gpu_unavailable_reason() in proc.stdout and "gpu-check: all GPU cells skipped" in proc.stdout


# -- CUDA fall-back detection -------------------------------------------------------------------
def test_check_providers_refuses_anything_but_cuda_first():
    from harness.runtimes.ort_cuda import ProviderFallbackError, check_providers

    check_providers(["CUDAExecutionProvider", "CPUExecutionProvider"])
    for active in (["CPUExecutionProvider"], [], ["TensorrtExecutionProvider", "CUDAExecutionProvider"]):
        with pytest.raises(ProviderFallbackError, match="refusing"):
            check_providers(active)


def test_cpu_only_onnxruntime_session_is_refused_not_reported_as_cuda(tmp_path):
    """Real onnxruntime (CPU build) asked for CUDA falls back to CPU; the runner must refuse it."""
    import onnx
    from onnx import TensorProto, helper

    from harness.runtimes.ort_cuda import OrtCudaAdapter, ProviderFallbackError

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    runner = OrtCudaAdapter(path, threads=1)
    # activate() would stop earlier on this machine (no GPU); the fall-back check must hold on
    # its own, e.g. on a GPU machine whose CUDA provider fails to initialise.
    with pytest.raises(ProviderFallbackError, match="CUDAExecutionProvider"):
        runner.activate_impl()
    assert runner.facts["providers"] == ["CPUExecutionProvider"]


# -- OpenVINO and TensorRT pure helpers -----------------------------------------------------------
def test_openvino_compile_config_pins_precision_and_threads():
    from harness.runtimes.openvino import (
        compile_config,
        reported_precision,
        summarise_error,
    )

    assert compile_config("fp32", 1) == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                                         "INFERENCE_NUM_THREADS": 1}
    assert compile_config("bf16", None)["INFERENCE_PRECISION_HINT"] == "bf16"
    assert compile_config("fp16", 2)["INFERENCE_PRECISION_HINT"] == "f16"
    assert [reported_precision(x) for x in ("f32", "float32", "bf16", "f16")] == ["fp32", "fp32", "bf16", "fp16"]
    text = ("Exception from src/inference/src/cpp/core.cpp:84:\nCheck 'false' failed at src/x.cpp:151:\n"
            "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted.\n"
            "Summary:\n-- Conversion is failed for: SequenceAt-17\n")
    assert summarise_error(text) == "FrontEnd API failed with OpConversionFailure: Conversion is failed for: SequenceAt-17"


def test_openvino_reported_precision_reads_a_real_compiled_model(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from harness.runtimes.openvino import OpenVinoAdapter

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with OpenVinoAdapter(tmp_path / "m.onnx", threads=1) as runner:
        assert runner.facts["precision"] == "fp32"
        for n in (2, 5):  # dynamic dim: two shapes through one compiled model
            x = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
            (y,) = runner.infer({"x": x})
            np.testing.assert_array_equal(y, np.maximum(x, 0))
        runner.timed_call({"x": np.ones((2, 3), np.float32)})()


def test_openvino_compiled_cache_is_written_once_and_loaded_by_another_process(tmp_path):
    """The latency phase's confirming workers load the model the first worker compiled: a second
    process finds it in the cache (OpenVINO says so), answers as the compiled one does, and runs
    the same execution graph (layers, kernels and precisions, read back after a timed call)."""
    from onnx import TensorProto, helper, save

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.1 * i for i in range(12)])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    script = ("import json, sys, numpy as np\n"
              "from pathlib import Path\n"
              "from harness.runtimes.base import LoadOptions\n"
              "from harness.runtimes.openvino import OpenVinoAdapter\n"
              "cache = Path(sys.argv[2]) if sys.argv[2] != '-' else None\n"
              "with OpenVinoAdapter(Path(sys.argv[1]), threads=1, load=LoadOptions(compiled_cache=cache)) as ov:\n"
              "    (y,) = ov.infer({'x': np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)})\n"
              "    ov.timed_call({'x': np.ones((2, 4), np.float32)})()\n"
              "    keys = ('layerType', 'primitiveType', 'runtimePrecision')\n"
              "    graph = [[op.get_rt_info()[k].astype(str) for k in keys] for op in ov.compiled.get_runtime_model().get_ordered_ops()]\n"
              "    print(json.dumps({'cached': ov.facts.get('loaded_from_cache'), 'y': y.tolist(), 'graph': graph}))\n")

    def run(cache: str) -> dict:
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m.onnx"), cache], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out.splitlines()[-1])

    cache = tmp_path / "compiled"
    plain, first, second = run("-"), run(str(cache)), run(str(cache))
    assert plain["cached"] is None and first["cached"] is False and second["cached"] is True
    assert any(cache.iterdir()), "the first process wrote nothing to the cache"
    assert first["y"] == plain["y"] and second["y"] == plain["y"]
    # What is timed is the same: OpenVINO's execution graph (each node's layer, kernel, precision).
    assert plain["graph"] and first["graph"] == plain["graph"] and second["graph"] == plain["graph"]
    assert any("f32" in kernel for _, kernel, _ in plain["graph"]), plain["graph"]


def test_tensorrt_profile_covers_example_and_second_shape():
    from harness.runtimes.tensorrt import optimisation_profile

    inputs = [("input_0", (-1, -1, 32)), ("mask", (4, 4))]
    shapes = [{"input_0": (2, 7, 32), "mask": (4, 4)}, {"input_0": (3, 8, 32), "mask": (4, 4)}]
    assert optimisation_profile(inputs, shapes) == {"input_0": ((2, 7, 32), (2, 7, 32), (3, 8, 32))}
    # renamed graph inputs are matched by position, as the worker matches feeds
    assert optimisation_profile([("x.1", (-1, 3))], [{"input_0": (2, 3)}, {"input_0": (5, 3)}]) == \
        {"x.1": ((2, 3), (2, 3), (5, 3))}
    assert optimisation_profile([("x", (2, 3))], [{"x": (2, 3)}]) == {}
    with pytest.raises(ValueError, match="does not fit"):
        optimisation_profile([("x", (-1, 3))], [{"x": (2, 4)}])
    with pytest.raises(ValueError, match="no shape"):
        optimisation_profile([("x", (-1, 3)), ("y", (-1,))], [{"z": (2, 3)}])


def test_tensorrt_flags_follow_precision_and_version():
    from harness.runtimes.tensorrt import PrecisionUnsupported, builder_flags

    trt10 = ["FP16", "BF16", "INT8", "TF32", "REFIT"]
    trt11 = ["TF32", "REFIT"]
    assert builder_flags("fp32", trt10) == ([], ["TF32"])       # fp32 means no TF32 either
    assert builder_flags("fp16", trt10) == (["FP16"], ["TF32"])
    assert builder_flags("bf16", trt10) == (["BF16"], ["TF32"])
    assert builder_flags("fp32", trt11) == ([], ["TF32"])
    with pytest.raises(PrecisionUnsupported, match="removed weak typing"):
        builder_flags("fp16", trt11)
    assert issubclass(PrecisionUnsupported, RuntimeUnavailable)  # a skip with the reason, not a failure


def test_tensorrt_parser_errors_keep_the_parsers_words():
    from harness.runtimes.tensorrt import format_parser_errors

    class ParserError:  # the shape of tensorrt.ParserError, which needs libnvinfer to construct
        def __init__(self, desc, node, op):
            self._d, self._n, self._op = desc, node, op

        def desc(self):
            return self._d

        def node(self):
            return self._n

        def node_operator(self):
            return self._op

    text = format_parser_errors([ParserError("SequenceAt: unsupported operator", 12, "SequenceAt"),
                                 ParserError("Failed to parse the model", -1, "")])
    assert text == ("SequenceAt: unsupported operator (node 12, op SequenceAt); Failed to parse the model")
    assert "without an error message" in format_parser_errors([])


# -- runtime version as an axis -------------------------------------------------------------------
def test_openvino_version_pin_gets_its_own_environment(tmp_path):
    from harness.matrix.config import load_matrix
    from harness.matrix.plan import build_plan

    path = tmp_path / "m.yaml"
    path.write_text("torch: ['2.13.0']\nexporters: [dynamo]\nopsets: [18]\ncases: [conv_bn]\n"
                    "runtimes: [ort-cpu, openvino, {name: openvino, version: '2026.3.1'}]\n")
    plan = build_plan(load_matrix(path))
    envs = {e.env.name: e.env for e in plan.environments}
    assert len(envs) == 2
    pinned = next(e for e in envs.values() if "openvino==2026.3.1" in e.packages)
    shared = next(e for e in envs.values() if e is not pinned)
    assert pinned.runtimes == ["openvino@2026.3.1"] and "openvino" in pinned.name
    assert {"onnxruntime==1.32.0", "openvino==2026.4.1"} <= set(shared.packages)
    assert sorted(shared.runtimes) == ["openvino", "ort-cpu"]


def test_an_output_at_a_new_shape_is_never_the_previous_calls(tmp_path):
    """OpenVINO 2026.4 with PERFORMANCE_HINT=LATENCY runs the TorchScript mha file (its Reshape
    baked at [2, 7, 32]) at [3, 8, 32] without raising; a reused request then handed back the
    example's output. Each runtime's answer at a shape must not depend on the call before it:
    the same as a fresh adapter that only ran that shape."""
    import torch

    from harness.probes.attention import mha
    from harness.runtimes.openvino import OpenVinoAdapter
    from harness.runtimes.ort_cpu import OrtCpuAdapter

    model, (x,), _ = mha()
    path = tmp_path / "mha.onnx"
    torch.onnx.export(model.eval(), (x,), str(path), dynamo=False, opset_version=17, input_names=["input_0"],
                      dynamic_axes={"input_0": {0: "batch", 1: "seq"}})
    first, second = {"input_0": x.numpy()}, {"input_0": np.random.default_rng(0).standard_normal((3, 8, 32),
                                                                                                  dtype=np.float32)}

    def answer(adapter, feeds):
        try:
            return [np.asarray(o) for o in adapter.infer(feeds)]
        except Exception as exc:  # noqa: BLE001 - a refusal is an answer too
            return type(exc).__name__

    for cls in (OpenVinoAdapter, OrtCpuAdapter):
        with cls(path, threads=1) as warm, cls(path, threads=1) as fresh:
            answer(warm, first)
            after, alone = answer(warm, second), answer(fresh, second)
        if isinstance(alone, str):
            assert after == alone, cls.name
            continue
        assert [o.shape for o in after] == [o.shape for o in alone], cls.name
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(after, alone)), cls.name
        assert [o.shape for o in after] != [(2, 7, 32)], cls.name   # not the example's output
