from __future__ import annotations

import numpy as np
import pytest

from harness.worker.parity import ParityError, compare_outputs


def test_within_tolerance_reports_numbers():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    stats = compare_outputs([a], [a + 1e-6], atol=1e-4, rtol=1e-3, label="x")
    assert 0 < stats["max_abs"] < 2e-6
    assert stats["outputs"][0]["worst_index"] is not None


def test_beyond_tolerance_names_worst_element():
    a = np.zeros((2, 3), dtype=np.float32)
    b = a.copy()
    b[1, 2] = 0.5
    with pytest.raises(ParityError, match=r"max_abs=0.5 at \[1, 2\]"):
        compare_outputs([a], [b], atol=1e-4, rtol=1e-3, label="x")


def test_shape_dtype_count_nan():
    a = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ParityError, match=r"shape \[3, 2\] != eager \[2, 3\]"):
        compare_outputs([a], [a.reshape(3, 2)], 1e-4, 1e-3, "x")
    with pytest.raises(ParityError, match="dtype"):
        compare_outputs([a], [a.astype(np.float64)], 1e-4, 1e-3, "x")
    with pytest.raises(ParityError, match="2 outputs"):
        compare_outputs([a], [a, a], 1e-4, 1e-3, "x")
    b = a.copy()
    b[0, 0] = np.nan
    with pytest.raises(ParityError, match="NaN"):
        compare_outputs([a], [b], 1e-4, 1e-3, "x")
    # NaN where eager has NaN too is agreement, not drift
    compare_outputs([b], [b.copy()], 1e-4, 1e-3, "x")


def test_second_shape_differs_in_every_dynamic_dim():
    torch = pytest.importorskip("torch")
    from harness.worker.parity import second_shape_inputs

    ids = torch.tensor([[5, 6, 7]])
    mask = torch.tensor([[True, True, False]])
    x = torch.randn(1, 3, 4)
    out = second_shape_inputs((x, ids, mask), {0: {0: "b", 1: "s"}, 1: {0: "b", 1: "s"}, 2: {0: "b", 1: "s"}})
    assert out[0].shape[:2] == out[1].shape == out[2].shape
    assert out[0].shape[0] != 1 and out[0].shape[1] != 3 and out[0].shape[2] == 4
    assert set(out[1].flatten().tolist()) <= {5, 6, 7}   # ids stay valid ids
    assert out[2].dtype == torch.bool


def test_nan_and_inf_at_the_same_places_pass_with_a_note():
    a = np.array([[np.nan, 1.0], [np.inf, -np.inf]], dtype=np.float32)
    stats = compare_outputs([a], [a.copy()], 1e-4, 1e-3, "example shape")
    assert stats["notes"] == ["example shape: output 0: 1 NaN and 2 Inf values at the same places as eager"]
    assert stats["outputs"][0]["nan"] == 1 and stats["outputs"][0]["inf"] == 2
    finite = np.ones((2, 2), dtype=np.float32)
    assert compare_outputs([finite], [finite], 1e-4, 1e-3, "x")["notes"] == []


def test_all_nan_on_both_sides_says_nothing_was_compared():
    a = np.full((2, 3), np.nan, dtype=np.float32)
    stats = compare_outputs([a], [a.copy()], 1e-4, 1e-3, "x")
    assert stats["max_abs"] == 0.0
    assert stats["notes"] == ["x: output 0: 6 NaN values at the same places as eager: "
                              "no finite value was compared"]


@pytest.mark.parametrize("eager, runtime, why", [
    ([np.nan, 1.0], [1.0, np.nan], "NaN where eager is not"),
    ([np.nan, 1.0], [0.0, 1.0], "not NaN where eager is NaN"),
    ([1.0, 2.0], [np.inf, 2.0], "Inf where eager is finite"),
    ([np.inf, 2.0], [3e38, 2.0], "finite where eager is Inf"),
    ([np.inf, 2.0], [-np.inf, 2.0], "Inf of the other sign"),
    ([np.inf, 2.0], [np.nan, 2.0], "NaN where eager is not"),
])
def test_nan_or_inf_anywhere_else_fails(eager, runtime, why):
    e, r = np.array(eager, dtype=np.float32), np.array(runtime, dtype=np.float32)
    with pytest.raises(ParityError, match=f"1/2 values {why}.*first at \\[[01]\\]"):
        compare_outputs([e], [r], 1e-4, 1e-3, "x")


# Tiny models whose outputs hold NaN or Inf: sqrt and 1/x agree with eager on where; fmod by zero
# is NaN everywhere; amax over a row holding NaN and sign(NaN) are where runtimes and torch differ
# (torch propagates NaN through amax and maps sign(NaN) to 0; ONNX Runtime 1.32 does neither).
NONFINITE_MODELS = {
    "sqrt": lambda torch, x: torch.sqrt(x),
    "reciprocal": lambda torch, x: 1.0 / x,
    "fmod_zero": lambda torch, x: torch.fmod(x, torch.zeros_like(x)),
    "amax_log": lambda torch, x: torch.log(x).amax(dim=-1),
    "sign_log": lambda torch, x: torch.sign(torch.log(x)),
}


def _direct_ort(fn, path):
    """Export with torch.onnx.export and run with onnxruntime directly (no harness code):
    (eager output, runtime output) on an input holding negatives and a zero."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")

    class M(torch.nn.Module):
        def forward(self, x):
            return fn(torch, x)

    x = torch.tensor([[1.0, -1.0, 0.0, 2.0], [-3.0, 0.5, 4.0, -1.0]])
    torch.onnx.export(M(), (x,), str(path), dynamo=False, opset_version=17)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return M()(x).numpy(), session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize("name", sorted(NONFINITE_MODELS))
def test_real_models_with_nan_or_inf_against_onnxruntime(name, tmp_path):
    eager, runtime = _direct_ort(NONFINITE_MODELS[name], tmp_path / "m.onnx")
    same_places = (np.array_equal(np.isnan(eager), np.isnan(runtime))
                   and np.array_equal(np.isposinf(eager), np.isposinf(runtime))
                   and np.array_equal(np.isneginf(eager), np.isneginf(runtime)))
    assert not np.isfinite(eager).all() or not np.isfinite(runtime).all()
    if same_places:
        stats = compare_outputs([eager], [runtime], 1e-4, 1e-3, "example shape")
        n_nan, n_inf = int(np.isnan(eager).sum()), int(np.isinf(eager).sum())
        note, = stats["notes"]
        assert note.startswith("example shape: output 0: ")
        assert (f"{n_nan} NaN" in note) == bool(n_nan) and (f"{n_inf} Inf" in note) == bool(n_inf)
    else:
        with pytest.raises(ParityError, match="NaN|Inf"):
            compare_outputs([eager], [runtime], 1e-4, 1e-3, "example shape")


def test_nonfinite_verdicts_cover_both_outcomes(tmp_path):
    """The models above include at least one agreement and one disagreement on this ORT."""
    agree = set()
    for name, fn in NONFINITE_MODELS.items():
        eager, runtime = _direct_ort(fn, tmp_path / f"{name}.onnx")
        if np.array_equal(np.isnan(eager), np.isnan(runtime)):
            agree.add(name)
    assert "fmod_zero" in agree and agree != set(NONFINITE_MODELS)


def test_worker_records_carry_the_nonfinite_note_or_fail_at_parity(tmp_path):
    """A real job through the worker's stages: NaN where eager has them is a pass with a note
    on the record; sign(NaN), which torch maps to 0 and ONNX Runtime keeps NaN, fails parity."""
    pytest.importorskip("onnxruntime")
    import json

    from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
    from harness.core.record import Record
    from harness.core.status import Status
    from harness.worker.main import run_job

    case = tmp_path / "nonfinite.py"
    case.write_text(
        "import torch\n"
        "class Sqrt(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.sqrt(x)\n"
        "class SignLog(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.sign(torch.log(x))\n"
        "X = [[1.0, -1.0, 0.0, 2.0], [-3.0, 0.5, 4.0, -1.0]]\n"
        "def sqrt():\n"
        "    return Sqrt(), (torch.tensor(X),)\n"
        "def sign_log():\n"
        "    return SignLog(), (torch.tensor(X),)\n")
    groups = tuple(ExportGroup(f"g-{fn}", fn, f"{case}:{fn}", "torchscript", 17,
                               cells=(CellJob(f"c-{fn}", "ort-cpu", "ort-cpu"),))
                   for fn in ("sqrt", "sign_log"))
    run_dir = tmp_path / "run $(touch pwned); 'q'"   # the repro line must quote it
    job = Job(run_id="r", run_dir=str(run_dir), env="env", groups=groups, base_dir=str(tmp_path),
              latency=LatencyProtocol(min_runs=2, min_time_s=0.0, warmup_runs=1, warmup_s=0.0))
    events: list[dict] = []
    run_job(Job.from_dict(json.loads(job.to_json())), events.append)
    recs = {r.case: r for r in (Record.from_dict(e["record"]) for e in events if e["event"] == "record")}
    # The same models exported and run directly: where eager and ONNX Runtime hold NaN.
    eager, runtime = _direct_ort(NONFINITE_MODELS["sqrt"], tmp_path / "sqrt.onnx")
    assert np.array_equal(np.isnan(eager), np.isnan(runtime))
    n_nan = int(np.isnan(eager).sum())
    assert recs["sqrt"].status is Status.PASS
    assert f"example shape: output 0: {n_nan} NaN values at the same places as eager" in recs["sqrt"].notes
    assert recs["sqrt"].parity.shapes[0]["outputs"][0]["nan"] == n_nan
    eager, runtime = _direct_ort(NONFINITE_MODELS["sign_log"], tmp_path / "sign.onnx")
    assert not np.array_equal(np.isnan(eager), np.isnan(runtime))
    assert (recs["sign_log"].status, recs["sign_log"].stage) == (Status.FAIL, "parity")
    assert "NaN where eager is not" in recs["sign_log"].error
    # The failing cell's one-line repro command survives a hostile run directory name.
    import shlex

    words = shlex.split(recs["sign_log"].repro)
    assert words[-2:] == [str(run_dir / "bundles" / "c-sign_log" / "cell.json"), "--print"]


def test_a_failing_comparison_keeps_the_numbers_of_every_output():
    a = np.zeros((2, 3), dtype=np.float32)
    b = a.copy()
    b[1, 2] = 0.5
    ok = np.ones(4, dtype=np.float32)
    with pytest.raises(ParityError, match=r"output 0: 1/6 elements beyond") as info:
        compare_outputs([a, ok, a], [b, ok + 1e-6, a.reshape(3, 2)], atol=1e-4, rtol=1e-3, label="x")
    stats = info.value.stats
    assert stats["max_abs"] == pytest.approx(0.5) and stats["max_rel"] > 0
    first, second, third = stats["outputs"]
    assert first["worst_index"] == [1, 2] and first["beyond"] == 1
    assert (first["eager"], first["runtime"]) == (0.0, 0.5) and "beyond" in first["error"]
    assert 0 < second["max_abs"] < 1e-5 and "error" not in second
    assert third["shape"] == [3, 2] and third["eager_shape"] == [2, 3] and third["max_abs"] is None
