"""The layer of the export stack a failing cell is blamed on (harness.worker.diagnose.layers), its
remedies and hint (harness.run.post.remedies, Blame.hint), the gate's and history's layer moves,
and blame accuracy against the labelled set (harness.bench.blame_accuracy)."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from harness.bench.blame_accuracy import LABELS, load_labels, score
from harness.core.record import LAYERS, Blame, Record, layer_change, read_records
from harness.core.status import Status


def _rec(torch="2.13.0", case="c", exporter="dynamo", opset=17, runtime="ort-cpu", status=Status.FAIL,
         stage="check", blame=None):
    return Record(run_id="r", case=case, torch=torch, exporter=exporter, opset=opset, runtime=runtime,
                  status=status, stage=stage if status is Status.FAIL else None, error="E" if status is Status.FAIL else None,
                  cell_id=f"torch{torch}-{case}-{exporter}-op{opset}-{runtime}",
                  options={"precision": "fp32", "dim_marking": "x" if exporter == "dynamo" else "y"}, blame=blame)


def test_torch_relative_paths_are_torch_and_probes_are_models():
    from harness.worker.diagnose.onnx_reference import library_file, model_file

    # torch prints its own files relative to its package in guard messages and logs
    assert library_file("_export/non_strict_utils.py") and not model_file("_export/non_strict_utils.py")
    assert library_file("_ops.py") and not model_file("_ops.py")
    assert model_file("/x/harness/probes/shapes.py") and not model_file("/x/harness/worker/stages.py")
    assert model_file("/home/u/models/m.py") and model_file("tests/cases/dim_policy.py")


def _export_ctx(exc: BaseException, events=()):
    return types.SimpleNamespace(failure=types.SimpleNamespace(exc=exc), export_facts=[],
                                 export_log=types.SimpleNamespace(events=list(events)))


def _raised(message: str) -> BaseException:
    try:
        try:
            raise RuntimeError(message)
        except RuntimeError as inner:
            raise ValueError("Failed to export the model with torch.export. This is step 1/3") from inner
    except ValueError as exc:
        return exc


def test_a_guard_in_the_models_own_frame_is_the_model_under_a_documented_limitation():
    from harness.worker.diagnose.layers import export_layer

    exc = _raised("GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1) "
                  "(_export/non_strict_utils.py:1066 in __torch_function__) ... "
                  '# File: /home/u/models/m.py:126 in forward, code: if x.sum() > 0:')
    b = export_layer(_export_ctx(exc), _rec(stage="export"), Blame("exporter", "r", "pytorch/pytorch"))
    assert (b.layer, b.kind, b.party, b.repository) == ("model code", "documented limitation", "model-code", None)
    assert b.source == "/home/u/models/m.py:126", b.source     # never torch's relative path
    assert "cond" in b.docs[0]


def test_a_guard_added_inside_torch_is_torch_exports_bug():
    from harness.worker.diagnose.layers import export_layer

    exc = _raised("Constraints violated (L['x'].size()[1])! For more information, run with TORCH_LOGS")
    ctx = _export_ctx(exc, [{"symbol": "s27", "value": 9, "at": "_ops.py:886", "source": "/m/model.py:14"}])
    b = export_layer(ctx, _rec(stage="export"), Blame("model-code", "r"))
    assert (b.layer, b.kind, b.party, b.repository) == ("capture: torch.export", "bug", "exporter", "pytorch/pytorch")
    # no place named at all: undetermined, saying what was tried, never a default
    b = export_layer(_export_ctx(exc), _rec(stage="export"), Blame("model-code", "r"))
    assert (b.layer, b.kind, b.repository) == ("undetermined", "undetermined", None)
    assert "tried" in b.reason


def test_the_hint_is_the_blames_and_names_only_seen_remedies():
    b = Blame("exporter", "r", "onnx/onnx", layer="version converter: onnx", kind="bug",
              experiments=[{"experiment": "optimize=False", "outcome": "fails"}])
    assert b.hint() == "version converter: onnx (bug; onnx/onnx): nothing tried works (tried: optimize=False)"
    b.remedies = ["opset 18 (tried: the native-opset export passes)"]
    assert b.hint().endswith("works with opset 18 (tried: the native-opset export passes)")
    assert Blame("exporter", "r").hint() is None    # records before layers: the pattern hints stay


def test_remedies_come_from_the_matrixs_own_passing_cells():
    from harness.run.post.remedies import add_remedies

    failing = _rec(torch="2.9.1", opset=17, blame=Blame("exporter", "r", "onnx/onnx", layer="version converter: onnx",
                                                        kind="bug"))
    records = [failing,
               _rec(torch="2.9.1", opset=18, status=Status.PASS),                       # another opset
               _rec(torch="2.9.1", exporter="torchscript", opset=17, status=Status.PASS),  # the other exporter
               _rec(torch="2.13.0", opset=17, status=Status.PASS),                      # a newer torch
               _rec(torch="2.9.1", opset=13, runtime="openvino", status=Status.PASS),   # another runtime: no
               _rec(torch="2.9.1", opset=13, status=Status.PASS)]   # its file is opset 18: not opset 13
    records[-1].opset_actual = 18
    assert add_remedies(records) == 1
    assert failing.blame.remedies == ["opset 18 (passes in this run: dynamo, torch 2.9.1)",
                                      "the torchscript exporter (passes in this run at opset 17, torch 2.9.1)",
                                      "torch 2.13.0 (fixed there: the same cell passes in this run)"]
    assert failing.hint.startswith(failing.blame.hint()) and failing.hint.startswith("version converter: onnx (bug; onnx/onnx)")
    assert add_remedies(records) == 0        # a second pass changes nothing


def test_a_failure_that_moved_layer_is_shown_by_the_gate():
    from harness.gate.compare import CellComparison, Verdict
    from harness.gate.output import blame_text

    base = _rec(torch="2.9.1", blame=Blame("exporter", "r", "microsoft/onnxscript", layer="optimizer: onnxscript"))
    cand = _rec(torch="2.13.0", blame=Blame("exporter", "r2", "microsoft/onnxscript", layer="translation: onnxscript",
                                            kind="bug"))
    moved = "blamed layer moved: optimizer: onnxscript (microsoft/onnxscript) → translation: onnxscript (microsoft/onnxscript)"
    assert layer_change(base, cand) == moved
    c = CellComparison(cand.key, Verdict.STILL_FAILING, base, cand)
    assert blame_text(c).endswith(moved) and c.to_dict()["layer_change"] == moved
    same = _rec(torch="2.13.0", blame=Blame("exporter", "r", "microsoft/onnxscript", layer="optimizer: onnxscript"))
    assert layer_change(base, same) is None and layer_change(None, cand) is None


def test_the_labelled_set_has_evidence_for_every_label():
    lines = [json.loads(x) for x in LABELS.read_text().splitlines() if x.strip()]
    labels = load_labels()
    assert len(labels) >= 40 and len({label.cell_id for label in labels}) == len(labels)
    for line in lines:
        assert line["evidence"] and all(e["observed"] for e in line["evidence"]), line["root_cause"]
        assert line["layer"] in LAYERS or line["layer"].startswith("runtime: "), line["layer"]
        assert line["kind"] in ("bug", "documented limitation")


def test_scoring_counts_wrong_and_missing_cells():
    labels = [label for label in load_labels() if label.root_cause.startswith("RC09")]
    right = [_rec(torch=c.split("-")[0][5:], case="data_dependent_scale", runtime=c.split("-op17-")[1],
                  blame=Blame("exporter", "r", "onnx/onnx", layer="version converter: onnx", kind="bug")) for c in
             (label.cell_id for label in labels)]
    for rec, label in zip(right, labels):
        rec.cell_id = label.cell_id
    result = score(right, labels)
    assert (result["party_accuracy"], result["repository_accuracy"], result["layer_accuracy"]) == (1.0, 1.0, 1.0)
    right[0].blame.repository = "pytorch/pytorch"
    result = score(right[:-1], labels)        # one wrong, one missing
    assert result["repository_right"] == len(labels) - 2 and len(result["wrong"]) == 2


@pytest.mark.e2e
def test_blame_accuracy_on_the_shared_e2e_run(e2e_run: Path):
    """The labelled cells the shared e2e run holds (mha's TorchScript cells, repeat_interleave and
    conv_bn on torch 2.6's dynamo exporter) are blamed on the labelled party and repository."""
    records = read_records(e2e_run / "results.jsonl")
    ids = {r.cell_id for r in records}
    labels = [label for label in load_labels() if label.cell_id in ids]
    assert len(labels) >= 10, sorted(ids)[:20]
    result = score(records, labels)
    assert result["party_accuracy"] >= 0.95 and result["repository_accuracy"] >= 0.95, result["wrong"]
    assert result["documented_limitations_sent_upstream_as_bug"] == 0


def _reduce_mean_18(path: Path) -> None:
    """ReduceMean at opset 18 (axes an input): the file torch.onnx writes before converting."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1, noop_with_empty_axes=0, name="mean")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])],
                              initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def test_a_converter_bug_ships_the_native_file_and_the_conversion_call(tmp_path):
    """The bundle of a version-converter blame reproduces it with onnx alone: the native file
    passes, onnx.version_converter's opset-17 file fails the checker (onnx keeps ReduceMean's
    opset-18 attribute noop_with_empty_axes)."""
    import subprocess
    import sys

    import numpy as np

    from harness.worker.diagnose.layer_experiments import kept
    from harness.worker.diagnose.layer_issue import layer_repro

    work, bundle = tmp_path / "work", tmp_path / "bundle"
    work.mkdir()
    bundle.mkdir()
    ctx = types.SimpleNamespace(onnx_path=work / "g.onnx", spec=types.SimpleNamespace(atol=1e-5, rtol=1e-4))
    _reduce_mean_18(kept(ctx, "native"))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.savez(bundle / "inputs.npz", x=x)
    np.savez(bundle / "expected.npz", output_0=x.mean(axis=1, keepdims=True))
    rec = _rec(opset=17, blame=Blame("exporter", "r", "onnx/onnx", layer="version converter: onnx", kind="bug"))
    lines = layer_repro(ctx, rec, bundle)
    assert any("repro_converter.py" in line for line in lines) and (bundle / "native.onnx").exists()
    proc = subprocess.run([sys.executable, "repro_converter.py"], cwd=bundle, capture_output=True, text=True)
    assert proc.returncode == 1 and "ok: native.onnx" in proc.stdout, proc.stdout + proc.stderr
    assert "Unrecognized attribute: noop_with_empty_axes" in proc.stderr, proc.stderr[-2000:]


def test_tracer_warnings_name_the_models_own_line():
    import torch

    from harness.worker.diagnose.tracing import model_freezes, tracer_warnings

    class Branch(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:      # the line a trace freezes
                return x + 1
            return x - 1

    with tracer_warnings() as found:
        torch.jit.trace(Branch(), torch.ones(2))
    frozen = model_freezes(found)
    assert frozen and frozen[0]["source"].endswith("if x.sum() > 0:      # the line a trace freezes"), found
    with tracer_warnings() as again:     # a repeated warning is seen again in a long-lived worker
        torch.jit.trace(Branch(), torch.ones(2))
    assert model_freezes(again)


def test_the_owner_of_a_node_inside_onnxscripts_function(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from harness.worker.diagnose.owners import checker_node, node_owner

    fn = helper.make_function("pkg.onnxscript.torch_lib", "aten_getitem", ["s"], ["o"],
                              [helper.make_node("Identity", ["s"], ["o"], name="inner")],
                              [helper.make_opsetid("", 18)])
    call = helper.make_node("aten_getitem", ["x"], ["y"], domain="pkg.onnxscript.torch_lib", name="node_aten_getitem_20")
    graph = helper.make_graph([call], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("pkg.onnxscript.torch_lib", 1)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    text = ("InferenceError: [ShapeInferenceError] Inference error(s): (op_type:aten_getitem, node name: "
            "node_aten_getitem_20): [ShapeInferenceError] Inferred shape and existing shape differ in rank")
    op, name = checker_node(text)
    owner = node_owner(tmp_path / "m.onnx", name, op)
    assert owner["repository"] == "microsoft/onnxscript"
    assert owner["function"] == "pkg.onnxscript.torch_lib::aten_getitem"
    assert node_owner(tmp_path / "m.onnx", "inner")["repository"] == "microsoft/onnxscript"


def test_a_dim_the_exporter_fixed_with_no_model_line_is_the_capture():
    from harness.worker.diagnose.layers import file_layer

    rec = _rec(torch="2.6.0", case="gru", stage="run")
    rec.error = "SecondShapeError: at second shape {'input_0': [3, 8, 16]}: rejected when growing 'seq'"
    rec.graph = {"specialised": [{"dim": "seq", "value": 9, "note": "seq was fixed to 9 by the exporter (input_0 dim 1)"}]}
    b = file_layer(types.SimpleNamespace(tracer_warnings=[]), rec, Blame("exporter", "r", "pytorch/pytorch"))
    assert (b.layer, b.kind, b.repository) == ("capture: torch.export", "bug", "pytorch/pytorch")
    # the same file with a value-freezing warning on the model's line: torch.onnx 2.6 traced it
    warned = [{"message": "Converting a tensor to a Python boolean", "source": "/m/model.py:3: if x.sum() > 0:",
               "model": True, "freezes": True}]
    b = file_layer(types.SimpleNamespace(tracer_warnings=warned), rec, Blame("exporter", "r", "pytorch/pytorch"))
    assert (b.layer, b.kind, b.party, b.repository) == ("model code", "documented limitation", "model-code", None)


def test_a_fixed_cell_says_what_its_baseline_failure_was_blamed_on():
    from harness.gate.compare import CellComparison, Verdict
    from harness.gate.output import fixed_text

    base = _rec(torch="2.6.0", stage="export", blame=Blame("exporter", "r", "microsoft/onnxscript",
                                                           layer="translation: onnxscript", kind="bug"))
    cand = _rec(torch="2.6.0", status=Status.PASS)
    c = CellComparison(cand.key, Verdict.FIXED, base, cand)
    assert fixed_text(c, "onnxscript 0.7.2") == ("fixed in onnxscript 0.7.2: the baseline's failure was "
                                                 "translation: onnxscript (microsoft/onnxscript)")
    assert fixed_text(CellComparison(cand.key, Verdict.UNCHANGED, cand, cand), "x") is None


def test_the_native_export_is_shared_by_the_groups_of_one_family(tmp_path, monkeypatch):
    """Two opsets of one dynamo family in one worker: the second takes the first's native-opset
    file and judgement (``shared``) and converts that file to its own opset itself, with the
    result a group exporting on its own gets; the same case with other weights exports its own."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    import onnx

    from harness.core.job import ExportGroup
    from harness.worker.cases import build_case
    from harness.worker.diagnose import layer_experiments as ex

    exported, dirs = [], iter(range(100))
    real = ex._export
    monkeypatch.setattr(ex, "_export", lambda ctx, path, **kw: (exported.append(ctx.group.opset), real(ctx, path, **kw)))

    def ctx_for(opset: int, spec, name: str = "x", shared: bool = True) -> types.SimpleNamespace:
        work = tmp_path / f"work{next(dirs)}"
        work.mkdir()
        with torch.no_grad():
            reference = spec.model(*spec.inputs).numpy()
        group = ExportGroup(gid=f"g{opset}", case="conv_bn", case_ref="conv_bn", exporter="dynamo", opset=opset)
        return types.SimpleNamespace(group=group, spec=spec, feeds=[{name: spec.inputs[0].numpy()}],
                                     references=[[reference]], onnx_path=work / "g.onnx",
                                     evidence_dir=tmp_path / "evidence" if shared else None)

    def plain(result: dict) -> dict:
        return {k: v for k, v in result.items() if k not in ("seconds", "shared")}

    spec = build_case("conv_bn", "conv_bn")
    probe = ctx_for(17, spec, shared=False)
    ex.native(probe)
    name = onnx.load(str(ex.kept(probe, "native"))).graph.input[0].name
    alone = ex.native(ctx_for(17, spec, name, shared=False))      # a group with nothing to share
    exported.clear()
    first, second = ctx_for(13, spec, name), ctx_for(17, spec, name)
    a, b = ex.native(first), ex.native(second)
    assert exported == [13], exported                              # one native export for the family
    assert b.get("shared") is True and "shared" not in a and "shared" not in alone
    assert plain(b) == plain(alone) and a["outcome"] == b["outcome"] == "passes"
    assert "converter" in a and "converter" in b
    assert ex.kept(second, "native").read_bytes() == ex.kept(first, "native").read_bytes()

    other = build_case("conv_bn", "conv_bn")
    with torch.no_grad():
        next(other.model.parameters()).add_(1.0)
    c = ex.native(ctx_for(17, other, name))
    assert exported == [13, 17] and "shared" not in c              # other weights: its own export
