from __future__ import annotations

import pytest

from harness.matrix.config import ConfigError, Matrix
from harness.matrix.environments import companion_pins
from harness.matrix.plan import build_plan
from harness.matrix.rules import matches, parse_only


def matrix(**kw) -> Matrix:
    base = dict(torch=["2.6.0", "2.13.0"], exporters=["torchscript", "dynamo"], opsets=[13, 17, 18],
                runtimes=["ort-cpu"], cases=["mha", "conv_bn"])
    return Matrix.model_validate({**base, **kw})


def test_cross_product_and_unique_ids():
    plan = build_plan(matrix())
    assert len(plan.cells) == 2 * 2 * 3 * 2
    assert len({c.cell_id for c in plan.cells}) == len(plan.cells)
    assert len(plan.environments) == 2  # one per torch version


def test_exclude_and_include():
    plan = build_plan(matrix(exclude=[{"exporter": "dynamo", "opset": [13, 17]}],
                             include=[{"torch": "2.13.0", "exporter": "dynamo", "opset": 20, "case": "mha"}]))
    ids = {c.cell_id for c in plan.cells}
    assert not any("dynamo-op13" in i or "dynamo-op17" in i for i in ids)
    assert "torch2.13.0-mha-dynamo-op20-ort-cpu" in ids
    assert len(plan.cells) == 24 - 8 + 1


def test_only_filter():
    plan = build_plan(matrix(), parse_only("torch=2.13.0,exporter=dynamo,opset=17|18"))
    assert {(c.torch, c.key.exporter, c.key.opset) for c in plan.cells} == {("2.13.0", "dynamo", 17), ("2.13.0", "dynamo", 18)}
    with pytest.raises(ConfigError, match="unknown axis"):
        parse_only("torchh=2.13.0")


def test_groups_export_once_per_case_exporter_opset():
    m = matrix(torch=["2.13.0"], runtimes=["ort-cpu"], cases=["mha"])
    env = build_plan(m).environments[0]
    groups = env.groups()
    assert len(groups) == 6
    assert all(len(g.cells) == 1 for g in groups)


def test_runtime_version_gets_its_own_environment():
    plan = build_plan(matrix(torch=["2.13.0"], runtimes=["ort-cpu", {"name": "ort-cpu", "version": "1.20.1"}]))
    assert len(plan.environments) == 2
    pkgs = [e.env.packages for e in plan.environments]
    assert any("onnxruntime==1.20.1" in p for p in pkgs)
    assert any("onnxruntime==1.32.0" in p for p in pkgs)


def test_constant_folding_axis_only_for_torchscript():
    plan = build_plan(matrix(torch=["2.13.0"], cases=["mha"], options={"constant_folding": [True, False]}))
    nofold = [c for c in plan.cells if not c.key.options.constant_folding]
    assert nofold and all(c.key.exporter == "torchscript" for c in nofold)


def test_env_hash_changes_with_pins():
    a = build_plan(matrix(torch=["2.13.0"])).environments[0].env
    b = build_plan(matrix(torch=[{"version": "2.13.0", "numpy": "2.3.5"}])).environments[0].env
    assert a.name != b.name and "numpy==2.3.5" in b.packages


def test_companion_pins():
    assert companion_pins("2.2.2")["numpy"].startswith("1.")
    assert companion_pins("2.6.0")["onnxscript"] < companion_pins("2.13.0")["onnxscript"]


def test_rule_matching():
    axes = {"torch": "2.13.0", "opset": 17, "exporter": "dynamo"}
    assert matches({"opset": 17}, axes)
    assert matches({"opset": [13, "17"]}, axes)
    assert matches({"torch": "~2\\.1[0-9]\\..*"}, axes)
    assert not matches({"exporter": "torchscript"}, axes)
