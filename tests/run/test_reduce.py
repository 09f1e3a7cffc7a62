"""Smallest failing graph, the parts that need no environment: what a record says to reproduce,
the reference values, the check on ONNX Runtime, input relaxation, the reductions sidecar. The
whole reduction (Polygraphy inside the cell's environment) is in test_reduce_e2e.py."""
from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from harness.core.cell import CellKey
from harness.core.paths import import_root
from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.run.post.reduction import eligible, polygraphy_dir
from harness.store.reductions import append_reduction
from harness.store.runs import load_run
from harness.worker.diagnose import reduce
from harness.worker.diagnose.reduce import (
    OTHER,
    PASSES,
    SAME,
    CheckServer,
    CheckSpec,
    Failure,
    PassHost,
    TensorStore,
    check_model,
    layerwise_values,
    relax_inputs,
    write_loader,
)

ORT_ERROR = ("SecondShapeError: at second shape {'input_0': [3, 7, 8]}: rejected when growing 'seq' "
             "(input_0 dim 1): Fail: [ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned "
             "while running Reshape node. Name:'/Reshape' Status Message: …")


def baked(path, extra_relu: bool = True):
    """x[b, s, 8] → Relu → Reshape to a target baked at s=6 → Relu: fails for any other s."""
    x = helper.make_tensor_value_info("input_0", TensorProto.FLOAT, ["b", "s", 8])
    y = helper.make_tensor_value_info("output_0", TensorProto.FLOAT, None)
    shape = helper.make_tensor("target", TensorProto.INT64, [2], [-1, 48])
    nodes = [helper.make_node("Relu", ["input_0"], ["r"]),
             helper.make_node("Reshape", ["r", "target"], ["flat"]),
             helper.make_node("Relu" if extra_relu else "Identity", ["flat"], ["output_0"])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_failure_read_from_the_record():
    f = Failure.from_record({"stage": "run", "error": ORT_ERROR})
    assert (f.stage, f.op, f.shape) == ("run", "Reshape", 1) and "Fail" in f.types
    assert "SecondShapeError" not in f.types
    p = Failure.from_record({"stage": "parity", "error": "ParityError: example shape: output 0 …"})
    assert p.shape == 0 and p.op is None
    assert Failure.from_record({"stage": "parity", "error": "ParityError: second shape: output 0 shape"}).shape == 1


def test_failure_matches_type_and_operator():
    f = Failure("run", ["Fail"], "Reshape")
    class Fail(Exception):
        pass
    assert f.matches(Fail("… while running Reshape node. Name:'x'"))
    assert not f.matches(Fail("… while running Concat node"))
    assert not f.matches(ValueError("… while running Reshape node"))


def test_reference_values_stop_at_the_first_failing_node(tmp_path):
    path = baked(tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((3, 7, 8)).astype(np.float32)
    values = layerwise_values(path, {"input_0": x}, deadline=float("inf"))
    assert set(values) == {"input_0", "r"}        # Reshape fails at s=7: nothing after it
    np.testing.assert_array_equal(values["r"], np.maximum(x, 0))
    ok = layerwise_values(path, {"input_0": x[:, :6]}, deadline=float("inf"))
    assert set(ok) == {"input_0", "r", "flat", "output_0"}


def _spec(tmp_path, stage: str, values: dict, expected: dict | None = None, types=("Fail",), op="Reshape"):
    TensorStore(values).save(tmp_path / "values.npz")
    exp = None
    if expected is not None:
        TensorStore(expected).save(tmp_path / "expected.npz")
        exp = str(tmp_path / "expected.npz")
    return CheckSpec(Failure(stage, list(types), op, 1), "ort-cpu", {}, 1, "fp32", str(tmp_path / "values.npz"),
                     exp, 1e-4, 1e-3, ["input_0"])


def test_check_reproduces_the_run_failure_and_nothing_else(tmp_path):
    path = baked(tmp_path / "m.onnx")
    x = np.ones((3, 7, 8), np.float32)
    spec = _spec(tmp_path, "run", {"input_0": x, "r": x})
    code, why = check_model(path, spec)
    assert code == SAME and "fails at run" in why and "Reshape" in why
    assert check_model(path, _spec(tmp_path, "run", {"input_0": x[:, :6]}))[0] == PASSES
    assert check_model(path, _spec(tmp_path, "run", {"input_0": x}, op="Concat"))[0] == OTHER
    # a subgraph fed from an intermediate tensor it has no value for cannot be judged
    sub = onnx.load(str(path))
    sub.graph.input[0].name = "unknown"
    sub.graph.node[0].input[0] = "unknown"
    onnx.save(sub, str(tmp_path / "sub.onnx"))
    assert check_model(tmp_path / "sub.onnx", spec)[0] == OTHER


def test_check_reproduces_a_parity_failure(tmp_path):
    path = baked(tmp_path / "m.onnx", extra_relu=False)
    x = np.ones((2, 6, 8), np.float32)
    good = np.ones((2, 48), np.float32)
    assert check_model(path, _spec(tmp_path, "parity", {"input_0": x}, {"output_0": good}))[0] == PASSES
    code, why = check_model(path, _spec(tmp_path, "parity", {"input_0": x}, {"output_0": good * 2}))
    assert code == SAME and "beyond atol" in why


def _ask(command: list[str], model, work) -> tuple[int, str]:
    """What Polygraphy does for one candidate: the graph saved as polygraphy_debug.onnx in the
    work folder, the check command run there; its exit code and the last line it printed."""
    shutil.copy(model, work / "polygraphy_debug.onnx")
    proc = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=120)
    return proc.returncode, (proc.stdout.strip().splitlines() or [proc.stderr])[-1]


def test_the_check_server_answers_as_the_fresh_check_process_does(tmp_path):
    """A run failure, a graph that runs and one that cannot be fed, each asked of the server
    through Polygraphy's check command and of the fresh-process check; then the server killed:
    the command falls back to the fresh check and still answers."""
    x = np.ones((3, 7, 8), np.float32)
    spec_path = _spec(tmp_path, "run", {"input_0": x, "r": x}).write(tmp_path / "check.json")
    baked(tmp_path / "fails.onnx")
    sub = onnx.load(str(tmp_path / "fails.onnx"))
    sub.graph.input[0].name = "unknown"
    sub.graph.node[0].input[0] = "unknown"
    onnx.save(sub, str(tmp_path / "unfed.onnx"))
    runs = helper.make_graph([helper.make_node("Relu", ["input_0"], ["output_0"])], "g",
                             [helper.make_tensor_value_info("input_0", TensorProto.FLOAT, ["b", "s", 8])],
                             [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(runs, opset_imports=[helper.make_opsetid("", 18)]), str(tmp_path / "runs.onnx"))
    work = tmp_path / "work"
    work.mkdir()
    fresh = [sys.executable, "-m", "harness.worker.diagnose.reduce", "check", "--spec", str(spec_path),
             "polygraphy_debug.onnx"]
    with open(tmp_path / "server.log", "w") as log, CheckServer(spec_path, fresh, 120.0, log) as server:
        assert server.command is not None, (tmp_path / "server.log").read_text()
        assert server.command[:3] == [sys.executable, "-I", "-S"]
        answers = {}
        for name, code in (("fails", SAME), ("runs", PASSES), ("unfed", OTHER)):
            by_server = _ask(server.command, tmp_path / f"{name}.onnx", work)
            by_fresh = _ask(fresh, tmp_path / f"{name}.onnx", work)
            assert by_server == by_fresh, (name, by_server, by_fresh)
            assert by_server[0] == code, (name, by_server)
            answers[name] = by_server
        server.proc.kill()
        server.proc.wait()
        assert _ask(server.command, tmp_path / "fails.onnx", work) == answers["fails"]
    assert not server.folder.exists() and "Traceback" not in (tmp_path / "server.log").read_text()


def test_a_check_that_crashes_or_hangs_ends_its_copy_only_and_is_no_same_failure(tmp_path, monkeypatch):
    x = np.ones((3, 7, 8), np.float32)
    spec = _spec(tmp_path, "run", {"input_0": x, "r": x})
    path = baked(tmp_path / "m.onnx")
    values = TensorStore.load(tmp_path / "values.npz")
    assert reduce._forked_check(path, spec, values, None, 60.0) == check_model(path, spec)

    def crashes(*args, **kwargs):
        faulthandler.disable()   # pytest's handler would print the copy's stack on the test's stderr
        os.kill(os.getpid(), signal.SIGSEGV)

    def hangs(*args, **kwargs):
        time.sleep(60)

    monkeypatch.setattr(reduce, "check_model", crashes)
    assert reduce._forked_check(path, spec, values, None, 60.0) == (OTHER, "the check's process killed by signal SIGSEGV")
    monkeypatch.setattr(reduce, "check_model", hangs)
    t0 = time.monotonic()
    assert reduce._forked_check(path, spec, values, None, 0.5) == (OTHER, "the check ran past 0.5 s")
    assert time.monotonic() - t0 < 30


def test_a_pass_in_the_pass_host_reduces_as_a_fresh_polygraphy_process_does(tmp_path, monkeypatch):
    """One Polygraphy pass over a failing file three ways: a fresh process, a copy the pass host
    forked, and (the host killed) the fresh process it falls back to: the same reduced graph. A
    pass past its time is stopped and says so."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(import_root()), str(polygraphy_dir())]))
    path = baked(tmp_path / "m.onnx")
    work = tmp_path / "work"
    work.mkdir()
    feeds = {"input_0": np.ones((3, 7, 8), np.float32)}
    spec = _spec(work, "run", layerwise_values(path, feeds, deadline=float("inf")))
    write_loader(work, feeds)
    check = [sys.executable, "-m", "harness.worker.diagnose.reduce", "check", "--spec",
             str(spec.write(work / "check.json")), "polygraphy_debug.onnx"]
    log_path = work / "polygraphy.log"
    ends = time.monotonic() + 300

    def one_pass(name, host=None, deadline=ends) -> bool:
        with open(log_path, "a") as log:
            return reduce._polygraphy(path, work / f"{name}.onnx", "outputs", "bisect", check, work, deadline, log, host)

    assert one_pass("fresh"), log_path.read_text()[-3000:]
    with open(log_path, "a") as log, PassHost(work / "values.npz", log, 300) as host:
        assert host.proc is not None, log_path.read_text()[-3000:]
        assert one_pass("host", host), log_path.read_text()[-3000:]
        assert not one_pass("late", host, deadline=time.monotonic() + 1.0)   # a check alone takes longer
        assert log_path.read_text().rstrip().endswith("stopped: time budget spent)")
        host.proc.kill()
        host.proc.wait()
        assert host.run(["--version"], work, log_path, 10) == PassHost.GONE
        assert one_pass("fallback", host), log_path.read_text()[-3000:]
    graphs = {name: onnx.load(str(work / f"{name}.onnx")).graph for name in ("fresh", "host", "fallback")}
    shapes = {name: [(n.op_type, list(n.input), list(n.output)) for n in g.node] for name, g in graphs.items()}
    assert shapes["fresh"] == shapes["host"] == shapes["fallback"] and len(shapes["fresh"]) < 3, shapes
    assert not (work / "late.onnx").exists()


def test_relaxed_inputs_take_the_values_shape_but_original_inputs_stay(tmp_path):
    model = onnx.load(str(baked(tmp_path / "m.onnx")))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 6
    relaxed = relax_inputs(onnx.ModelProto.FromString(model.SerializeToString()), {"input_0": np.ones((3, 7, 8))})
    assert relaxed.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "input_0_d1"
    kept = relax_inputs(model, {"input_0": np.ones((3, 7, 8))}, keep={"input_0"})
    assert kept.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 6
    onnx.save(relaxed, str(tmp_path / "r.onnx"))
    ort.InferenceSession(str(tmp_path / "r.onnx"))   # still a valid file


def test_tensor_store_keeps_names_npz_cannot(tmp_path):
    store = TensorStore({"/attn/Reshape_output_0": np.arange(3), "x:0": np.ones(1)})
    store.save(tmp_path / "v.npz")
    back = TensorStore.load(tmp_path / "v.npz").values
    assert set(back) == {"/attn/Reshape_output_0", "x:0"}
    np.testing.assert_array_equal(back["/attn/Reshape_output_0"], np.arange(3))


def test_only_load_run_and_parity_failures_are_eligible():
    key = CellKey("c", "dynamo", 18, "ort-cpu")
    rec = lambda status, stage=None: Record.for_cell("r", key, "2.13.0", "e", status, stage=stage)
    assert eligible(rec(Status.FAIL, "run")) is None and eligible(rec(Status.XFAIL, "parity")) is None
    assert "only failures at load, run, parity" in eligible(rec(Status.FAIL, "export"))
    assert eligible(rec(Status.PASS)) and eligible(rec(Status.CRASH))


def test_reductions_join_the_records_when_a_run_is_read(tmp_path):
    RunMeta(run_id="r", started=1.0, finished=True).write(tmp_path)
    key = CellKey("c", "dynamo", 18, "ort-cpu")
    rec = Record.for_cell("r", key, "2.13.0", "e", Status.FAIL, stage="run", graph={"nodes": 9})
    append_record(tmp_path / "results.jsonl", rec)
    before = (tmp_path / "results.jsonl").read_bytes()
    append_reduction(tmp_path, rec.cell_id, {"nodes": 5})
    append_reduction(tmp_path, rec.cell_id, {"nodes": 1, "original_nodes": 9})
    _, records = load_run(tmp_path)
    assert records[0].graph == {"nodes": 9, "reduced": {"nodes": 1, "original_nodes": 9}}
    assert (tmp_path / "results.jsonl").read_bytes() == before    # the finished run is not rewritten
