"""The dynamo exporter's dim marking, checked against torch's own dynamic_axes conversion in each
installed environment (torch 2.6.0 and 2.13.0 here), and the export call built from structured inputs."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, TESTS

# Runs in an environment's python: torch's own conversion of {"input": {0: "batch1"}} vs ours.
SNIPPET = r"""
import json, torch
from harness.worker.export import dim_marker, dim_marking
model, x = torch.nn.Linear(3, 2), torch.zeros(2, 3)
axes = {"input": {0: "batch1"}}
try:
    from torch.onnx._internal.exporter import _dynamic_shapes as conv
    shapes, _, _ = conv.from_dynamic_axes_to_dynamic_shapes(model, (x,), None, dynamic_axes=axes,
                                                             output_names=set(), input_names=["input"])
    shapes, _ = conv.convert_str_to_export_dim(shapes)
except ImportError:
    from torch.onnx._internal.exporter import _compat as conv
    shapes = conv._from_dynamic_axes_to_dynamic_shapes(model, (x,), None, dynamic_axes=axes,
                                                        output_names=set(), input_names=["input"])
theirs, ours = shapes[0][0], dim_marker(dim_marking())("batch1")
def describe(d):
    return [type(d).__name__, getattr(d, "__name__", repr(d)), getattr(d, "min", None), getattr(d, "max", None)]
print(json.dumps({"torch": torch.__version__, "marking": dim_marking(), "theirs": describe(theirs),
                  "ours": describe(ours)}))
"""


def _env_python(version: str) -> Path:
    """The environment the gate matrix (tests/matrices/gate.yaml) gives ``version``, built here when
    no earlier test built it (the venv provider reuses a finished one)."""
    from harness.core.paths import envs_dir
    from harness.envs import make_provider
    from harness.matrix.config import load_matrix
    from harness.matrix.environments import env_spec_for

    matrix = load_matrix(TESTS / "matrices" / "gate.yaml")
    spec = env_spec_for(matrix.torch_entry(version), matrix.runtimes[0], matrix)
    make_provider("venv", log=lambda *a, **k: None).ensure(spec)
    return envs_dir() / spec.name / "bin" / "python"


@pytest.mark.e2e
@pytest.mark.parametrize("version,marking", [("2.6.0", "Dim(name, max=99999)"), ("2.13.0", "Dim.DYNAMIC")])
def test_dim_marking_is_what_torch_itself_makes_of_dynamic_axes(version, marking):
    python = _env_python(version)
    proc = subprocess.run([str(python), "-c", SNIPPET], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["marking"] == marking
    assert out["theirs"] == out["ours"], out
