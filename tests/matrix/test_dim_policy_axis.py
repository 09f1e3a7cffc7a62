"""The dim_policy axis in matrix.yaml and the plan: one export per policy for dynamo's dynamic
cells, one cell for TorchScript (it keeps dynamic_axes) and for static exports."""
from __future__ import annotations

import pytest

from harness.matrix.config import ConfigError, Matrix, load_matrix, matrix_hash
from harness.matrix.plan import build_plan
from harness.matrix.rules import parse_only


def matrix(**kw) -> Matrix:
    base = dict(torch=["2.13.0"], exporters=["torchscript", "dynamo"], opsets=[18], runtimes=["ort-cpu"],
                cases=["mha"], options={"dim_policy": [None, "dynamic", "auto", "named"]})
    return Matrix.model_validate({**base, **kw})


def test_policies_multiply_dynamo_cells_only():
    plan = build_plan(matrix())
    ids = sorted(c.cell_id for c in plan.cells)
    assert ids == ["torch2.13.0-mha-dynamo-op18-dim-auto-ort-cpu", "torch2.13.0-mha-dynamo-op18-dim-dynamic-ort-cpu",
                   "torch2.13.0-mha-dynamo-op18-dim-named-ort-cpu", "torch2.13.0-mha-dynamo-op18-ort-cpu",
                   "torch2.13.0-mha-torchscript-op18-ort-cpu"]
    static = build_plan(matrix(options={"dim_policy": ["auto", "named"], "dynamic": [False]}))
    assert [c.cell_id for c in static.cells] == ["torch2.13.0-mha-torchscript-op18-static-ort-cpu",
                                                 "torch2.13.0-mha-dynamo-op18-static-ort-cpu"]


def test_each_policy_is_its_own_export_group():
    groups = build_plan(matrix(exporters=["dynamo"])).environments[0].groups()
    assert len({g.gid for g in groups}) == 4
    assert {g.options.dim_policy for g in groups} == {None, "dynamic", "auto", "named"}
    # The default policy keeps the group id the first release gave it (log file names).
    default = next(g for g in groups if g.options.dim_policy is None)
    plain = build_plan(matrix(exporters=["dynamo"], options={})).environments[0].groups()[0]
    assert default.gid == plain.gid


def test_rules_and_only_name_the_policy():
    plan = build_plan(matrix(exclude=[{"dim_policy": "named"}]), parse_only("dim_policy=auto|dynamic"))
    assert sorted(c.key.options.dim_policy for c in plan.cells) == ["auto", "dynamic"]


def test_hash_of_a_matrix_without_the_new_keys_is_unchanged():
    old = Matrix.model_validate(dict(torch=["2.13.0"], exporters=["dynamo"], opsets=[18], cases=["mha"]))
    explicit = Matrix.model_validate(dict(torch=["2.13.0"], exporters=["dynamo"], opsets=[18], cases=["mha"],
                                          options={"dim_policy": [None]}, reduce=False, reduce_timeout_s=120))
    assert matrix_hash(old) == matrix_hash(explicit)
    assert matrix_hash(old) != matrix_hash(matrix(exporters=["dynamo"], torch=["2.13.0"], opsets=[18]))


def test_bad_policy_names_file_and_key(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text('torch: ["2.13.0"]\nexporters: [dynamo]\nopsets: [18]\ncases: [mha]\n'
                    "options: {dim_policy: [auto, fixed]}\n")
    with pytest.raises(ConfigError, match=r"m.yaml: key 'options.dim_policy\[1\]'.*'fixed'"):
        load_matrix(path)
    path.write_text('torch: ["2.13.0"]\nexporters: [dynamo]\nopsets: [18]\ncases: [mha]\n'
                    "include: [{dim_policy: fixed}]\n")
    with pytest.raises(ConfigError, match=r"key 'include\[0\]\.dim_policy'"):
        load_matrix(path)
