"""Built-in probes: contract checks in-process, and each probe's verdict on torch 2.13.0 from one
real run of tests/matrices/probes.yaml (both exporters, ort-cpu).

A verdict that differs from what the upstream thread describes is recorded here as a finding
(`FINDINGS`), not hidden: it is what current torch does.
"""
from __future__ import annotations

import inspect
import json
import subprocess

import pytest
from helpers import TESTS, run_matrix

from harness.probes import GROUPS, PROBES, REAL_MODELS, TRAP_PROBES
from harness.worker.cases import resolve_target

PASS = ("pass", None)
# (case, exporter, opset, constant_folding) -> (status, stage) on torch 2.13.0, ort-cpu.
EXPECTED: dict[tuple[str, str, int, bool], tuple[str, str | None]] = {
    # MHA lowers to SDPA (opset >= 14) and bakes Reshape targets (#128610): TorchScript only.
    ("mha", "torchscript", 13, True): ("fail", "export"),
    ("mha", "torchscript", 17, True): ("fail", "run"),
    ("mha", "dynamo", 13, True): PASS,
    ("mha", "dynamo", 17, True): PASS,
    ("transformer_encoder", "torchscript", 13, True): ("fail", "export"),
    ("transformer_encoder", "torchscript", 17, True): ("fail", "run"),
    ("transformer_encoder", "dynamo", 17, True): PASS,
    ("sdpa", "torchscript", 13, True): ("fail", "export"),  # pytorch/pytorch#97262
    ("sdpa", "torchscript", 17, True): PASS,
    ("sdpa", "dynamo", 13, True): PASS,
    ("sdpa", "dynamo", 17, True): PASS,
    # Tracing freezes the branch the example took; torch.export refuses the data-dependent if.
    ("control_flow", "torchscript", 17, True): ("fail", "parity"),
    ("control_flow", "dynamo", 17, True): ("fail", "export"),
    ("data_dependent_scale", "torchscript", 17, True): PASS,
    ("data_dependent_scale", "dynamo", 18, True): PASS,
    ("conv_bn", "torchscript", 17, True): PASS,
    ("conv_bn", "dynamo", 17, True): PASS,
}
# Where torch 2.13.0 no longer shows the trap the upstream thread reports (findings).
FINDINGS: dict[tuple[str, str, int, bool], tuple[str, str | None]] = {
    # #78060: need_weights=True takes the explicit bmm/softmax path, no SDPA: passes even at 13.
    **{("mha_kv", e, o, True): PASS for e in ("torchscript", "dynamo") for o in (13, 17)},
    # #52252 / TensorRT#4268: both exporters now insert a Cast; Concat is single-typed.
    **{("int_concat", e, 17, True): PASS for e in ("torchscript", "dynamo")},
    # #104190: axes as an input at 18 is valid ONNX and ORT runs it (TensorRT is not tested here).
    **{("reduce_axes", e, o, True): PASS for e in ("torchscript", "dynamo") for o in (17, 18)},
    # #69605: Shape->Gather is no longer folded into a literal, with or without folding.
    ("shape_fold", "torchscript", 17, True): PASS,
    ("shape_fold", "torchscript", 17, False): PASS,
    ("shape_fold", "dynamo", 17, True): PASS,
    # #100429/#100438: repeat_interleave with tensor repeats exports and runs at other sizes.
    **{("repeat_interleave", e, 17, True): PASS for e in ("torchscript", "dynamo")},
    # #165748: list-form dynamic_axes, also handed to dynamo, relate the shared dims correctly.
    **{("dynamic_axes_names", e, 17, True): PASS for e in ("torchscript", "dynamo")},
    **{(rnn, e, 17, True): PASS for rnn in ("lstm", "gru") for e in ("torchscript", "dynamo")},
    # New trap: dynamo writes opset 18 and down-converts to 17, keeping ReduceMean's opset-18
    # attribute noop_with_empty_axes, which the checker rejects (passes at 18, above).
    ("data_dependent_scale", "dynamo", 17, True): ("fail", "check"),
}
VERDICTS = {**EXPECTED, **FINDINGS}


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "probes", "probes.yaml")


@pytest.fixture(scope="module")
def probe_records(probe_run):
    from harness.core.record import read_records

    recs = read_records(probe_run / "results.jsonl")
    return {(r.case, r.exporter, r.opset, r.options.get("constant_folding", True)): r for r in recs}


def test_probes_group_is_every_trap_probe_and_no_real_model():
    assert GROUPS["probes"] == list(TRAP_PROBES)
    assert not set(GROUPS["real"]) & set(GROUPS["probes"])
    assert set(PROBES) == set(TRAP_PROBES) | set(REAL_MODELS)
    assert {k[0] for k in VERDICTS} == set(TRAP_PROBES)


@pytest.mark.parametrize("name", list(TRAP_PROBES))
def test_probe_declares_trap_origin_and_tolerances(name):
    fn = resolve_target(name)
    doc = inspect.getdoc(fn) or ""
    assert "Trap" in doc and "Upstream" in doc, f"{name}: docstring must state the trap and cite upstream"
    assert isinstance(getattr(fn, "atol", None), float) and isinstance(getattr(fn, "rtol", None), float)


@pytest.mark.parametrize("name", list(TRAP_PROBES))
def test_probe_second_shape_is_valid_in_eager(name):
    """The harness's second shape (example wrapped along dynamic dims) must be a sane input."""
    import torch

    from harness.worker.cases import build_case
    from harness.worker.outputs import flatten_outputs
    from harness.worker.parity import second_shape_inputs

    spec = build_case(name, name)
    second = second_shape_inputs(spec.inputs, spec.dynamic_dims)
    with torch.no_grad():
        for inputs in filter(None, (spec.inputs, second)):
            for out in flatten_outputs(spec.model(*inputs)):
                assert not (out.dtype.kind == "f" and (out != out).any()), f"{name}: NaN in eager"


@pytest.mark.e2e
@pytest.mark.parametrize("key", sorted(VERDICTS), ids=lambda k: "-".join(map(str, k)))
def test_probe_verdict_on_torch_2_13(probe_records, key):
    rec = probe_records[key]
    assert (rec.status, rec.stage) == VERDICTS[key], rec.error
    # How long a probe's export takes is the bench's business (nox -s bench), never a test's.
    assert rec.duration_s["export"] is not None


@pytest.mark.e2e
def test_failures_carry_signature_hint_and_names(probe_records):
    sdpa = {probe_records[(c, "torchscript", 13, True)].signature
            for c in ("mha", "sdpa", "transformer_encoder")}
    assert len(sdpa) == 1, "one upstream bug (SDPA at opset 13) must be one signature"
    assert "opset >= 14" in probe_records[("sdpa", "torchscript", 13, True)].hint
    baked = probe_records[("mha", "torchscript", 17, True)]
    assert baked.signature == probe_records[("transformer_encoder", "torchscript", 17, True)].signature
    assert "export shape" in baked.hint
    ok = probe_records[("conv_bn", "dynamo", 17, True)]
    assert ok.graph["inputs"] == ["input_0"] and ok.graph["outputs"] == ["output_0"]
    assert not ok.notes


@pytest.mark.parametrize("key", [("mha", "torchscript", 17, True),
                                 ("control_flow", "torchscript", 17, True)])
@pytest.mark.e2e
def test_repro_command_reproduces_the_verdict(probe_records, key):
    rec = probe_records[key]
    assert rec.repro and rec.bundle
    proc = subprocess.run(rec.repro, shell=True, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (again["status"], again["stage"], again["error"]) == (rec.status, rec.stage, rec.error)


def test_real_models_form_their_own_group_and_pins_follow_torch():
    from harness.matrix.config import load_matrix
    from harness.probes.real import companion_extras, torchvision_for

    assert torchvision_for("2.13.0") == "0.28.0" and torchvision_for("2.14.1") == "0.29.1"
    assert torchvision_for("2.6.0") == "0.21.0"
    assert companion_extras("2.14.1") == ["torchvision==0.29.1", "transformers==4.57.6"]
    matrix = load_matrix(TESTS / "matrices" / "real_models.yaml")
    assert [c.label for c in matrix.cases] == list(REAL_MODELS)


@pytest.mark.parametrize("name", list(REAL_MODELS))
def test_real_model_without_its_package_is_a_skip(name):
    import importlib.util

    from harness.worker.cases import CaseSkipped, build_case

    fn = resolve_target(name)
    if all(importlib.util.find_spec(p) for p in fn.requires):
        pytest.skip(f"{fn.requires} installed here: the real run covers {name}")
    with pytest.raises(CaseSkipped, match="not installed"):
        build_case(name, name)


def test_training_mode_and_export_names_are_notes(tmp_path):
    """GroupContext.prepare: a model returned in training mode is exported in eval mode with a
    note; input/output names given at export are checked in the graph (kept here: no note)."""
    from harness.core.job import ExportGroup, Job
    from harness.worker.stages import GroupContext

    case = tmp_path / "train_case.py"
    case.write_text(
        "import torch\n"
        "def dropout_net():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))\n"
        "    return model.train(), (torch.randn(2, 4),), {0: {0: 'batch'}}\n")
    group = ExportGroup(gid="g", case="dropout_net", case_ref=f"{case}:dropout_net",
                        exporter="torchscript", opset=17)
    job = Job(run_id="t", run_dir=str(tmp_path), env="e", groups=(group,), base_dir=str(tmp_path))
    ctx = GroupContext(job, group, tmp_path)
    ctx.prepare()
    assert ctx.failure is None, ctx.failure
    assert not ctx.spec.model.training
    assert any("training mode" in n for n in ctx.notes)
    assert not any("names" in n for n in ctx.notes), ctx.notes
    assert ctx.graph["outputs"] == ["output_0"]
