"""matrix.yaml's pipelines and exporter switches: checked before anything is installed, planned as
axes; a matrix without them plans exactly the cells, groups and environments it always did."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.matrix.config import ConfigError, load_matrix
from harness.matrix.plan import build_plan

BASE = """
torch: ["2.13.0"]
exporters: [torchscript, dynamo]
opsets: [18]
runtimes: [ort-cpu, openvino]
cases: [mha, conv_bn]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_a_matrix_without_pipelines_plans_raw_cells_only(tmp_path):
    plan = build_plan(load_matrix(write(tmp_path, BASE)))
    cells = plan.cells
    assert len(cells) == 2 * 2 * 2
    assert {c.key.options.pipeline for c in cells} == {"raw"}
    assert all("pipeline" not in c.key.options.to_dict() and "pipe" not in c.cell_id for c in cells)
    assert all(c.steps == () and c.judge is None for c in cells)
    packages = plan.environments[0].env.packages
    assert not [p for p in packages if p.startswith(("onnxslim", "onnxconverter-common", "onnxsim"))]


def test_pipelines_are_an_axis_with_their_steps_and_judges(tmp_path):
    text = BASE + """
pipelines:
  raw: []
  fused: [{ort-fusion: {model_type: bert}}, fp16]
  int8: [onnxslim, quantize-static]
  mine: ["tests/cases/steps.py:identity"]
cases:
  - target: mha
    tolerances: {int8: {cosine: 0.95}}
  - conv_bn
"""
    text = text.replace("cases: [mha, conv_bn]\n", "")
    plan = build_plan(load_matrix(write(tmp_path, text)))
    by = {(c.key.case, c.key.exporter, c.key.runtime, c.key.options.pipeline): c for c in plan.cells}
    assert len(plan.cells) == 2 * 2 * 2 * 4
    fused = by[("mha", "dynamo", "ort-cpu", "fused")]
    assert [s["step"] for s in fused.steps] == ["ort-fusion", "fp16"]
    assert fused.steps[0]["args"] == {"model_type": "bert", "num_heads": 0, "hidden_size": 0, "opt_level": None}
    assert fused.judge == {"class": "fp16", "atol": 1e-2, "rtol": 1e-2}
    assert fused.cell_id.endswith("-pipe-fused-ort-cpu")
    assert by[("mha", "dynamo", "ort-cpu", "int8")].judge["cosine"] == 0.95     # the case's own
    assert by[("conv_bn", "dynamo", "ort-cpu", "int8")].judge["cosine"] == 0.99  # the default
    assert by[("mha", "dynamo", "ort-cpu", "mine")].judge is None
    # one export group per pipeline, and the step libraries installed with their pins
    env = plan.environments[0]
    assert len(env.groups()) == 2 * 2 * 4
    assert "onnxslim==0.1.98" in env.env.packages and "onnxconverter-common==1.16.0" in env.env.packages


def test_a_torch_entry_pins_a_step_library(tmp_path):
    text = BASE.replace('torch: ["2.13.0"]', 'torch: [{version: "2.13.0", onnxslim: "0.1.90"}]')
    plan = build_plan(load_matrix(write(tmp_path, text + "pipelines: {slim: [onnxslim]}\n")))
    packages = plan.environments[0].env.packages
    assert "onnxslim==0.1.90" in packages and "onnxslim==0.1.98" not in packages
    assert {c.key.options.pipeline for c in plan.cells} == {"slim"}


def test_exporter_switches_apply_to_dynamo_cells_only(tmp_path):
    text = BASE + "options: {optimize: [true, false], external_data: [false]}\n"
    cells = build_plan(load_matrix(write(tmp_path, text))).cells
    dynamo = {(c.key.options.optimize, c.key.options.external_data) for c in cells if c.key.exporter == "dynamo"}
    assert dynamo == {(True, False), (False, False)}
    assert {(c.key.options.optimize, c.key.options.external_data)
            for c in cells if c.key.exporter == "torchscript"} == {(None, None)}
    assert any(c.cell_id.endswith("-noopt-onefile-ort-cpu") for c in cells)


@pytest.mark.parametrize("pipelines, key, expected", [
    ("{x: [onnxslimm]}", "pipelines.x[0]", "unknown step 'onnxslimm'"),
    ("{x: [{ort-fusion: {model_type: bertt}}]}", "pipelines.x[0].ort-fusion.model_type", "expected one of"),
    ("{x: [{ort-fusion: {heads: 4}}]}", "pipelines.x[0].ort-fusion.heads", "unknown argument"),
    ("{x: [{fp16: {keep_io_types: maybe}}]}", "pipelines.x[0].fp16.keep_io_types", "true or false"),
    ("{raw: [onnxslim]}", "pipelines.raw", "expected []"),
    ("{x: []}", "pipelines.x", "at least one step"),
    ("{x: [{onnxslim: {}, fp16: {}}]}", "pipelines.x[0]", "one step per entry"),
    ("{x: onnxslim}", "pipelines.x", "valid list"),
])
def test_bad_pipelines_name_file_key_and_expectation(tmp_path, pipelines, key, expected):
    path = write(tmp_path, BASE + f"pipelines: {pipelines}\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    text = str(err.value)
    assert str(path) in text and f"key '{key}'" in text and expected in text and "\n" not in text


def test_an_include_names_a_pipeline_of_the_matrix(tmp_path):
    path = write(tmp_path, BASE + "pipelines: {raw: []}\ninclude: [{pipeline: half}]\n")
    with pytest.raises(ConfigError, match=r"key 'include\[0\]\.pipeline'.*expected a pipeline of this matrix"):
        load_matrix(path)


def test_bad_input_exits_2_before_anything_is_installed(tmp_path):
    from helpers import run_harness

    path = write(tmp_path, BASE + "pipelines: {x: [nosuchstep]}\n")
    result = run_harness("plan", "--config", str(path), check=False)
    assert result.returncode == 2, result.stderr
    assert "pipelines.x[0]" in result.stderr and "unknown step" in result.stderr
