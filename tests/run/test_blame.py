"""The blame ladder (harness/worker/diagnose/blame.py) end to end on tests/matrices/blame.yaml (torch
2.13.0, ONNX Runtime and OpenVINO), each party checked against plain onnx.reference and ONNX
Runtime with no harness code (tests/direct_blame.py), and its classification on given rungs."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import TESTS, env_python, run_matrix

from harness.core.record import Blame, Record, read_records
from harness.core.status import Status

BLAME_RUN_ENV = "HARNESS_BLAME_RUN_DIR"   # a finished run of blame.yaml to reuse while developing


@pytest.fixture(scope="module")
def blame_run(tmp_path_factory) -> Path:
    reuse = os.environ.get(BLAME_RUN_ENV)
    if reuse and (Path(reuse) / "run.json").exists():
        return Path(reuse)
    return run_matrix(tmp_path_factory, "blame", "blame.yaml")


@pytest.fixture(scope="module")
def records(blame_run):
    return {r.cell_id: r for r in read_records(blame_run / "results.jsonl")}


def direct(blame_run: Path, rec: Record) -> dict:
    meta = json.loads((blame_run / "run.json").read_text())
    proc = subprocess.run([str(env_python(meta, rec.torch)), str(TESTS / "direct_blame.py"), rec.bundle],
                          capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.e2e
def test_openvino_sequence_lens_is_blamed_on_openvino(blame_run, records):
    rec = records["torch2.13.0-packed_given-torchscript-op17-openvino"]
    assert (rec.status, rec.stage) == (Status.FAIL, "parity"), rec.error
    assert (rec.blame.party, rec.blame.repository) == ("runtime-kernel", "openvinotoolkit/openvino"), rec.blame
    assert rec.blame.rung("onnx-reference")["outcome"] == "no-reference"
    assert "sequence_lens" in rec.blame.rung("onnx-reference")["detail"]
    assert rec.blame.rung("ort-disable-all")["outcome"] == rec.blame.rung("ort-default")["outcome"] == "agrees"
    # by hand: ONNX Runtime agrees with eager on the same file and inputs
    assert direct(blame_run, rec) == {"onnx-reference": "no-reference", "ort-disable-all": "agrees",
                                      "ort-default": "agrees"}


@pytest.mark.e2e
def test_a_size_baked_by_the_models_own_int_is_blamed_on_the_model(blame_run, records):
    for cell in ("torch2.13.0-flatten_mean-dynamo-op17-dim-named-ort-cpu",
                 "torch2.13.0-flatten_mean-dynamo-op17-dim-named-openvino",
                 "torch2.13.0-flatten_mean-torchscript-op17-ort-cpu",
                 "torch2.13.0-flatten_mean-torchscript-op17-openvino"):
        rec = records[cell]
        assert rec.status is Status.FAIL, cell
        assert rec.blame.party == "model-code", (cell, rec.blame)
        assert rec.blame.source.endswith("dim_policy.py:20: n = int(x.shape[1])"), rec.blame.source
        # by hand: the reference itself rejects the second shape: no runtime is to blame
        assert direct(blame_run, rec)["onnx-reference"] == "fails", cell


@pytest.mark.e2e
def test_export_failures_and_passes(records):
    for rec in records.values():
        if rec.status is Status.PASS:
            assert rec.blame is None and "blame" not in rec.duration_s, rec.cell_id
            assert "blame" not in rec.to_dict()
        elif rec.stage == "export":
            # torch.export fails inside torch's own LSTM code on a packed sequence
            assert (rec.blame.party, rec.blame.repository) == ("exporter", "pytorch/pytorch"), rec.blame
            assert rec.blame.source.endswith("structured.py:50: out, (h, _) = self.rnn(packed)")
        else:
            assert rec.blame is not None and rec.blame.seconds is not None, rec.cell_id
    assert any(r.status is Status.PASS for r in records.values())


def _rec(runtime="ort-cpu", error="ParityError: example shape: output 0: ...", precision="fp32"):
    return Record(run_id="r", case="c", torch="2.13.0", exporter="dynamo", opset=18, runtime=runtime,
                  status=Status.FAIL, stage="parity", error=error, options={"precision": precision})


def _rungs(**outcomes):
    return [{"rung": k.replace("_", "-"), "outcome": v, "detail": ""} for k, v in outcomes.items()]


@pytest.mark.parametrize("runtime,outcomes,party", [
    ("ort-cpu", dict(onnx_reference="agrees", ort_disable_all="agrees", ort_default="differs"), "runtime-optimizer"),
    ("ort-cpu", dict(onnx_reference="agrees", ort_disable_all="differs", ort_default="differs"), "runtime-kernel"),
    ("ort-cpu", dict(onnx_reference="differs", ort_disable_all="differs", ort_default="differs"), "exporter"),
    ("openvino", dict(onnx_reference="differs", ort_disable_all="differs", ort_default="differs"), "exporter"),
    ("openvino", dict(onnx_reference="no-reference", ort_disable_all="agrees", ort_default="agrees"), "runtime-kernel"),
    ("openvino", dict(onnx_reference="no-reference", ort_disable_all="differs", ort_default="differs"), "unknown"),
    ("ort-cpu", dict(onnx_reference="no-reference", ort_disable_all="fails", ort_default="fails"), "unknown"),
])
def test_classification(runtime, outcomes, party):
    from harness.worker.diagnose.blame import classify

    blame = classify(_rec(runtime), _rungs(**outcomes), [], [], reduced=False)
    assert blame.party == party, blame.reason
    assert (blame.repository is None) == (party == "unknown")


def test_reduced_precision_passing_at_fp32_is_runtime_precision():
    from harness.worker.diagnose.blame import classify

    rungs = _rungs(onnx_reference="agrees", ort_disable_all="agrees", ort_default="agrees", runtime_fp32="agrees")
    blame = classify(_rec("openvino", precision="fp16"), rungs, [], [], reduced=True)
    assert (blame.party, blame.repository) == ("runtime-precision", "openvinotoolkit/openvino")


def test_export_blame_from_the_exception_chain():
    from harness.worker.diagnose.blame import blame_export

    def guard():
        raise RuntimeError("Constraints violated (seq)! ... File \"/models/m.py\", line 3, in forward")

    try:
        try:
            guard()
        except RuntimeError as inner:
            raise ValueError("Failed to export the model with torch.export.") from inner
    except ValueError as exc:
        b = blame_export(exc, "dynamo")
    assert b.party == "model-code" and b.source.startswith("/models/m.py:3"), b
    try:
        raise KeyError("x") from NotImplementedError("No ONNX function found for aten.foo")
    except KeyError as exc:
        assert blame_export(exc, "dynamo").repository == "pytorch/pytorch"


def test_records_without_blame_load_and_write_as_before():
    old = {"schema": 1, "run_id": "r", "case": "c", "torch": "2.13.0", "exporter": "dynamo", "opset": 18,
           "runtime": "ort-cpu", "status": "fail", "stage": "run", "error": "E"}
    rec = Record.from_dict(old)
    assert rec.blame is None and "blame" not in rec.to_dict()
    new = Record.from_dict({**old, "blame": {"party": "runtime-kernel", "reason": "r", "evidence": [{"rung": "x"}]}})
    assert isinstance(new.blame, Blame) and new.to_dict()["blame"]["party"] == "runtime-kernel"
    assert Record.from_dict(json.loads(new.to_json())).blame == new.blame


@pytest.mark.e2e
def test_report_groups_failures_by_party_and_shows_root_causes(blame_run, records):
    md = (blame_run / "matrix.md").read_text(encoding="utf-8")
    section = md.split("## Failures by blamed party", 1)[1].split("\n## ", 1)[0]
    assert "| runtime-kernel | openvinotoolkit/openvino |       1 |" in section
    assert "| model-code     | the model's own code     |       4 |" in section
    sigs = md.split("## Failures by signature", 1)[1].split("\n## ", 1)[0]
    # the root cause, not torch.onnx's wrapper ("Failed to export the model with torch.export")
    assert "| export  | TypeError: zeros(): argument 'size'" in sigs
    assert "numerical drift" not in sigs and "mark that dim dynamic" not in sigs   # hints fit the facts
    html = (blame_run / "matrix.html").read_text(encoding="utf-8")
    assert 'data-party-filter="1"' in html and 'id="blame-section"' in html
    assert 'data-party="runtime-kernel"' in html


def test_old_runs_render_without_blame(tmp_path):
    from helpers import BOTH, FIXTURES

    from harness.report.html import render_run_html
    from harness.report.markdown import render_markdown
    from harness.store.runs import load_run

    meta, recs = load_run(FIXTURES / "runs" / BOTH)
    assert not any(r.blame for r in recs)
    assert "Failures by blamed party" not in render_markdown(recs, meta)
    html = render_run_html(FIXTURES / "runs" / BOTH, recs, meta)
    assert "data-party" not in html and "blame-section" not in html


def test_gate_failures_carry_their_blame():
    from harness.gate.compare import CellComparison, Verdict
    from harness.gate.output import blame_text

    cand = _rec("openvino")
    cand.blame = Blame("runtime-kernel", "ONNX Runtime agrees with eager and openvino does not",
                       "openvinotoolkit/openvino")
    c = CellComparison(cand.key, Verdict.NEW_FAILURE, None, cand)
    assert blame_text(c) == ("blame: runtime-kernel (openvinotoolkit/openvino): ONNX Runtime agrees with eager "
                             "and openvino does not")
    assert c.to_dict()["blame"]["party"] == "runtime-kernel"


def test_hints_fit_the_cells_blame():
    from harness.run.annotate import Annotator

    drift = ("ParityError: example shape: output 0: 48/180 elements beyond atol=0.0001 rtol=0.001; max_abs=0.349 "
             "at [1, 4, 6] (eager 0, runtime -0.348654); max_rel=3.49e+11")
    assert Annotator(xfail=[])(_rec("openvino", drift)).hint is None    # not drift: values are wrong
    kernel = _rec("openvino", drift)
    kernel.blame = Blame("runtime-kernel", "r", "openvinotoolkit/openvino")
    assert "a runtime bug" in Annotator(xfail=[])(kernel).hint
    second = "SecondShapeError: at second shape {'input_0': [3, 7, 8]}: rejected when growing 'seq'"
    fixed = _rec("ort-cpu", second)
    fixed.stage = "run"
    assert "mark that dim dynamic" in Annotator(xfail=[])(fixed).hint
    fixed.blame = Blame("model-code", "seq was fixed", None, source="m.py:3: n = int(x.shape[1])")
    assert "marking more dims does not help" in Annotator(xfail=[])(fixed).hint


@pytest.mark.e2e
def test_every_repro_fails_the_same_way_without_the_project(blame_run, records):
    """Each failing cell's repro.py, run in the cell's environment from its bundle with nothing of
    this project on the path, fails at the cell's stage with the cell's error type."""
    meta = json.loads((blame_run / "run.json").read_text())
    # one cell per stage that fails in this matrix (each repro imports torch: seconds apiece)
    chosen = ["torch2.13.0-packed_given-dynamo-op17-ort-cpu", "torch2.13.0-flatten_mean-dynamo-op17-dim-named-ort-cpu",
              "torch2.13.0-packed_given-torchscript-op17-openvino"]
    assert {records[c].stage for c in chosen} == {"export", "run", "parity"}
    for rec in (records[c] for c in chosen):
        bundle = Path(rec.bundle)
        script = (bundle / "repro.py").read_text()
        assert "import harness" not in script and "from harness" not in script, rec.cell_id
        assert (bundle / "case_source.py").exists()
        proc = subprocess.run([str(env_python(meta, rec.torch)), "repro.py"], cwd=bundle, capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin"}, timeout=300)
        assert proc.returncode == 1, (rec.cell_id, proc.stdout[-2000:], proc.stderr[-3000:])
        stages = [ln.split(":", 1)[1].strip() for ln in proc.stdout.splitlines() if ln.startswith("repro stage:")]
        assert stages[-1] == rec.stage, (rec.cell_id, stages, proc.stderr[-2000:])
        if rec.stage == "parity":
            assert "AssertionError" in proc.stderr, rec.cell_id
        else:
            root = rec.error.rsplit(" <- ", 1)[-1].split(":", 1)[0].split()[-1]
            assert root in proc.stderr or rec.stage == "run", (rec.cell_id, root, proc.stderr[-1500:])
        issue = (bundle / "ISSUE.md").read_text()
        assert "## Versions" in issue and "python repro.py" in issue and rec.blame.party in issue


@pytest.mark.e2e
def test_bundles_hold_onnx_test_data(records):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    rec = records["torch2.13.0-packed_given-torchscript-op17-openvino"]
    bundle = Path(rec.bundle)
    inputs = np.load(bundle / "inputs.npz")
    expected = np.load(bundle / "expected.npz")
    for i, name in enumerate(inputs.files):
        t = onnx.load_tensor(str(bundle / "test_data_set_0" / f"input_{i}.pb"))
        assert t.name == name and np.array_equal(numpy_helper.to_array(t), inputs[name])
    out = numpy_helper.to_array(onnx.load_tensor(str(bundle / "test_data_set_0" / "output_0.pb")))
    assert np.array_equal(out, expected["output_0"])
    assert (bundle / "test_data_set_1" / "input_0.pb").exists()     # the second shape


@pytest.mark.e2e
def test_torchscript_floor_division_is_blamed_on_the_exporter(blame_run, records):
    for runtime in ("ort-cpu", "openvino"):
        rec = records[f"torch2.13.0-floor_divide-torchscript-op17-{runtime}"]
        assert (rec.status, rec.stage) == (Status.FAIL, "parity"), rec.error
        assert (rec.blame.party, rec.blame.repository) == ("exporter", "pytorch/pytorch"), rec.blame
        assert rec.blame.rung("onnx-reference")["outcome"] == "differs"
        # a TorchScript file has no link to torch's tensors: said, not guessed
        assert rec.blame.divergence["node"] is None and "no mapping" in rec.blame.divergence["reason"]
        assert direct(blame_run, rec)["onnx-reference"] == "differs"     # by hand
    assert records["torch2.13.0-floor_divide-dynamo-op17-ort-cpu"].status is Status.PASS


@pytest.mark.e2e
def test_first_diverging_node_of_a_dynamo_file(blame_run, tmp_path):
    """A dynamo file changed at one known layer (block.fc2's weight): the first diverging node is
    that layer's Gemm, with its aten op, module path and the model's source line."""
    from helpers import ROOT

    meta = json.loads((blame_run / "run.json").read_text())
    proc = subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "divergence_driver.py"), str(tmp_path)],
                          capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    found = out["found"]
    assert out["changed"] == "block.fc2.weight"
    assert (found["op"], found["aten"], found["module"]) == ("Gemm", "aten.linear.default", "block.fc2 (Linear)"), found
    assert found["source"].endswith("return self.fc2(torch.relu(self.fc1(x)))")
    assert found["compared"] >= 2 and found["max_abs"] > 0.1     # fc1's value agreed before it
    assert out["torchscript"]["node"] is None and "no mapping" in out["torchscript"]["reason"]


def test_the_drift_hint_needs_small_relative_errors():
    from harness.run.annotate import Annotator

    small = _rec("openvino", "ParityError: example shape: output 0: 3/240 elements beyond atol=0.0001 rtol=0.001; "
                             "max_abs=0.002 at [0] (eager 1, runtime 1.002); max_rel=0.002")
    assert "numerical drift" in Annotator(xfail=[])(small).hint
    wrong = _rec("openvino", "ParityError: example shape: output 0: 5/14 elements beyond atol=0.0001 rtol=0.001; "
                             "max_abs=1 at [0, 1] (eager -3, runtime -2); max_rel=0.5")
    assert Annotator(xfail=[])(wrong).hint is None


@pytest.mark.e2e
def test_reduced_precision_failing_where_fp32_passes(tmp_path_factory):
    run_dir = run_matrix(tmp_path_factory, "precision", "blame_precision.yaml")
    rec = {r.runtime: r for r in read_records(run_dir / "results.jsonl")}["openvino"]
    if rec.options.get("precision") != "bf16":
        pytest.skip(f"this CPU has no bf16 kernels (OpenVINO ran at {rec.options.get('precision')})")
    assert (rec.status, rec.stage) == (Status.FAIL, "parity"), rec.error
    assert (rec.blame.party, rec.blame.repository) == ("runtime-precision", "openvinotoolkit/openvino"), rec.blame
    assert rec.blame.rung("runtime-fp32")["outcome"] == rec.blame.rung("onnx-reference")["outcome"] == "agrees"
