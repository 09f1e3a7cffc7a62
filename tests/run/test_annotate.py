"""Failure signatures and hints, on error strings recorded from real runs."""
from __future__ import annotations

import pytest

from harness.core.record import Record
from harness.run.annotate import Annotator, first_sentence, normalize_error, signature

# SDPA at opset 13, TorchScript exporter: torch 2.6.0 ends the advice with a period, 2.13.0 not.
SDPA_26 = ("UnsupportedOperatorError: Exporting the operator 'aten::scaled_dot_product_attention' "
           "to ONNX opset version 13 is not supported. Support for this operator was added in "
           "version 14, try exporting with this version.")
SDPA_213 = SDPA_26.rstrip(".")
SDPA_OTHER_ADVICE = ("UnsupportedOperatorError: Exporting the operator "
                     "'aten::scaled_dot_product_attention' to ONNX opset version 12 is not "
                     "supported. Please feel free to request support or submit a pull request "
                     "on PyTorch GitHub: https://github.com/pytorch/pytorch/issues.")
# The Reshape baked from the dummy input: same bug in two modules, different node names, shapes.
RESHAPE_MHA = (
    "SecondShapeError: at second shape {'input_0': [3, 8, 32]} (dynamic dims {0: {0: 'batch', "
    "1: 'seq'}}): Fail: [ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while "
    "running Reshape node. Name:'/attn/Reshape_4' Status Message: /onnxruntime_src/onnxruntime/"
    "core/providers/cpu/tensor/reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(")
RESHAPE_ENCODER = (
    "SecondShapeError: at second shape {'input_0': [3, 8, 32], 'input_1': [3, 8]} (dynamic dims "
    "{0: {0: 'batch', 1: 'seq'}, 1: {0: 'batch', 1: 'seq'}}): Fail: [ONNXRuntimeError] : 1 : "
    "FAIL : Non-zero status code returned while running Reshape node. "
    "Name:'/encoder/layers.0/self_attn/Reshape_4' Status Message: /onnxruntime_src/onnxruntime/"
    "core/providers/cpu/tensor/reshape_helper.h:91 onnxruntime::Reshape")
DISPATCH = ("ConversionError: Failed to convert the exported program to an ONNX model. This is "
            "step 3/3 of exporting the model to ONNX. Next steps: <- DispatchError: No ONNX "
            "function found for <OpOverload(op='aten.repeat_interleave', overload='Tensor')>. "
            "Failure message: No decompositions registered for the real-valued input")
BN_INFER = ("InferenceError: [ShapeInferenceError] Inference error(s): (op_type:_aten_native_batch"
            "_norm_inference_onnx, node name: node__aten_native_batch_norm_inference_onnx_4): "
            "[ShapeInferenceError] Inferred shape and existing shape differ in dimension 0: (16) vs (0)")
CONTROL_FLOW = ("TorchExportError: Failed to export the model with torch.export. \x1b[96mThis is "
                "step 1/3\x1b[0m of exporting the model to ONNX. Next steps: <- "
                "GuardOnDataDependentSymNode: Could not guard on data-dependent expression "
                "Eq(u0, 1) (unhinted: Eq(u0, 1)).  (Size-like symbols: none)")
DOWNCONVERT = "ValidationError: Unrecognized attribute: noop_with_empty_axes for operator ReduceMean"
PARITY_SECOND = ("ParityError: second shape: output 0: 12/12 elements beyond atol=1e-05 "
                 "rtol=0.001; max_abs=1.81 at [0, 0]")
PARITY_SECOND_OTHER = ("ParityError: second shape: output 1: 3/48 elements beyond atol=0.0001 "
                       "rtol=0.001; max_abs=0.0412 at [2, 7, 1]")


def rec(error: str, stage: str = "export", **kw) -> Record:
    base = dict(run_id="r", case="c", torch="2.13.0", exporter="torchscript", opset=13,
                runtime="ort-cpu", status="fail")
    return Record(**{**base, **kw}, stage=stage, error=error)


def test_first_sentence_cuts_advice_not_dotted_names():
    assert first_sentence("Failed to export the model with torch.export. This is step 1/3") == \
        "Failed to export the model with torch.export"
    assert first_sentence("No function for aten.repeat_interleave here") == \
        "No function for aten.repeat_interleave here"
    assert first_sentence("beyond atol=0.001; max_abs=1.81 at [0, 0]") == \
        "beyond atol=0.001; max_abs=1.81 at [0, 0]"
    assert first_sentence("\n\nsecond line only.\nthird") == "second line only"


def test_sdpa_error_is_one_signature_across_torch_versions_and_opsets():
    sigs = {signature(rec(e, torch=t, opset=o)) for e, t, o in
            [(SDPA_26, "2.6.0", 13), (SDPA_213, "2.13.0", 13), (SDPA_OTHER_ADVICE, "2.9.1", 12)]}
    assert len(sigs) == 1
    # The operator name is what tells one upstream bug from another: it must survive.
    assert "'aten::scaled_dot_product_attention'" in normalize_error(SDPA_26)


def test_baked_reshape_is_one_signature_across_modules():
    a, b = normalize_error(RESHAPE_MHA), normalize_error(RESHAPE_ENCODER)
    assert a == b
    assert a.startswith("SecondShapeError: at second shape <dict>")
    assert "Reshape node" in a and "/attn" not in a


def test_root_cause_is_kept_and_normalized():
    text = normalize_error(DISPATCH)
    assert text.startswith("ConversionError: Failed to convert the exported program to an ONNX model <- DispatchError:")
    assert "aten.repeat_interleave" in text and "Failure message" not in text
    assert normalize_error(CONTROL_FLOW) == (
        "TorchExportError: Failed to export the model with torch.export <- "
        "GuardOnDataDependentSymNode: Could not guard on data-dependent expression "
        "Eq(<sym>, <n>) (unhinted: Eq(<sym>, <n>))")


def test_node_names_and_numbers_are_normalized():
    text = normalize_error(BN_INFER)
    assert "node <name>" in text and "_4" not in text and "(16)" not in text
    assert normalize_error(PARITY_SECOND) == normalize_error(PARITY_SECOND_OTHER)


@pytest.mark.parametrize("error", [SDPA_26, RESHAPE_MHA, DISPATCH, BN_INFER, CONTROL_FLOW])
def test_signature_differs_by_stage_and_bug(error):
    assert signature(rec(error, stage="export")) != signature(rec(error, stage="run"))
    assert signature(rec(error)) != signature(rec(DOWNCONVERT))
    assert signature(rec(error)).startswith("export:")


def test_no_signature_for_passes():
    assert signature(rec(None, stage=None, status="pass")) is None


@pytest.mark.parametrize("error,stage,needle", [
    (SDPA_213, "export", "opset >= 14"),
    (RESHAPE_MHA, "run", "export shape"),
    (CONTROL_FLOW, "export", "torch.cond"),
    (DOWNCONVERT, "check", "opset >= 18 with dynamo"),
    (PARITY_SECOND, "parity", "frozen at tracing"),
    (DISPATCH, "export", "onnxscript"),
    ("Fail: [ONNXRuntimeError] : 1 : FAIL : Load model failed: Type Error: Type (tensor(int32)) "
     "of input parameter (/Cast_output_0) of operator (Concat) in node (/Concat) is invalid.",
     "load", "cast shape tensors to int64"),
    ("[TRT] [E] ITensor::getDimensions: Error Code 4: Internal Error (/ReduceMean: axes must be "
     "an initializer or constant)", "load", "opset 17"),
])
def test_hints_for_traps(error, stage, needle):
    out = Annotator(xfail=[])(rec(error, stage=stage))
    assert out.hint and needle in out.hint, out.hint


UNORDERED = "IndexError: unordered_map::at"


@pytest.mark.parametrize("error,stage", [
    (SDPA_213, "export"), (RESHAPE_MHA, "run"), (PARITY_SECOND, "parity"), (UNORDERED, "export"),
    (DISPATCH, "export"), (CONTROL_FLOW, "export"), (DOWNCONVERT, "check"),
    ("TypeError: Unsupported value type for opset 13", "export"),
])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_hints_never_suggest_the_exporter_the_cell_uses(error, stage, exporter):
    from harness.run.annotate import suggests_exporter

    out = Annotator(xfail=[])(rec(error, stage=stage, exporter=exporter))
    assert out.hint is None or not suggests_exporter(out.hint, exporter), out.hint


def test_a_dynamo_graph_rejecting_the_second_shape_gets_its_own_hint():
    ts = Annotator(xfail=[])(rec(RESHAPE_MHA, stage="run", exporter="torchscript"))
    dy = Annotator(xfail=[])(rec(RESHAPE_MHA, stage="run", exporter="dynamo"))
    assert "dynamo exporter" in ts.hint
    assert dy.hint and "dynamo exporter" not in dy.hint and "mark that dim dynamic" in dy.hint


def test_every_hint_that_names_an_exporter_is_kept_from_that_exporters_cells():
    from harness.run.annotate import load_hints, suggests_exporter

    named = 0
    for hint in load_hints():
        forced = {**hint, "pattern": "."}  # match any error: only stage / exporter / the guard decide
        for exporter in ("torchscript", "dynamo"):
            out = Annotator(xfail=[], hints=[forced])(rec("Error: x", stage=hint.get("stage", "export"),
                                                          exporter=exporter))
            if suggests_exporter(hint["hint"], exporter):
                named += 1
                assert out.hint is None, (hint["hint"], exporter)
            elif hint.get("exporter", exporter) == exporter and not hint.get("requires_blame") \
                    and "max_rel_below" not in hint:   # facts "Error: x" lacks
                assert out.hint == hint["hint"]
    assert named >= 3, "hints.yaml suggests exporters in several hints"


def test_reference_failures_say_nothing_was_exported():
    out = Annotator(xfail=[])(rec("AssertionError: lengths must be sorted", stage="reference"))
    assert "nothing was exported" in out.hint
