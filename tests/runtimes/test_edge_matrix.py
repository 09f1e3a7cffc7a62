"""The shipped edge matrix plans the edge runtimes into their families; the default one has none."""
from __future__ import annotations

from helpers import ROOT

from harness.matrix.config import load_matrix
from harness.matrix.plan import build_plan

EDGE = {"opencv-dnn", "ort-node", "ort-web", "ort-openvino"}


def test_edge_matrix_plans_each_family_and_npm_versions_reach_the_worker():
    plan = build_plan(load_matrix("edge"))
    envs = {e.env.name.split("-", 1)[1].rsplit("-", 1)[0]: e.env for e in plan.environments}
    assert set(envs) == {"cpu", "cpu-opencv-dnn4.13.0.92", "node", "ort-openvino"}
    assert "opencv-python-headless==5.0.0.93" in envs["cpu"].packages and "onnxruntime==1.32.0" in envs["cpu"].packages
    assert "onnxruntime-openvino==1.24.1" in envs["ort-openvino"].packages
    assert not any(p.startswith("onnxruntime") for p in envs["ort-openvino"].packages if not p.startswith("onnxruntime-openvino"))
    node = envs["node"]
    assert not any("onnxruntime" in p for p in node.packages)          # npm packages, not pip ones
    assert node.runtime_options == {"ort-node": {"npm_version": "1.30.0"}, "ort-web": {"npm_version": "1.30.0"}}


def test_a_pinned_npm_version_gets_its_environment_and_its_version():
    from harness.matrix.config import Matrix

    m = Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18], "cases": ["conv_bn"],
                               "runtimes": ["ort-web", {"name": "ort-web", "version": "1.22.0"}]})
    envs = build_plan(m).environments
    assert sorted(e.env.runtime_options[next(iter(e.env.runtime_options))]["npm_version"] for e in envs) == ["1.22.0", "1.30.0"]


def test_default_matrix_has_no_edge_runtime_and_images_exist():
    from harness.envs.docker.images import RECIPES, dockerfile, recipe_for

    assert not EDGE & {r.name for r in load_matrix(ROOT / "matrix.yaml").runtimes}
    plan = build_plan(load_matrix("edge"))
    for e in plan.environments:
        assert dockerfile(recipe_for(e.env)).exists(), e.env.name
    assert {"node", "ort-openvino"} <= set(RECIPES)
