"""gate --package onnxscript with real releases, torch 2.13.0 held: onnxscript 0.6.0 → 0.5.4 breaks
every dynamo export (torch 2.13 imports onnxscript._framework_apis.torch_2_11, new in 0.6) and
no TorchScript one; checked against the same environments driven directly (tests/direct_onnxscript.py)."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import TESTS, run_harness

from harness.core.paths import envs_dir

pytestmark = pytest.mark.e2e


def test_an_onnxscript_downgrade_breaks_dynamo_exports_only(tmp_path):
    out = tmp_path / "gate"
    proc = run_harness("--reports", str(tmp_path / "reports"), "gate", "--config",
                       str(TESTS / "matrices" / "package_gate.yaml"), "--package", "onnxscript",
                       "--baseline", "0.6.0", "--candidate", "0.5.4", "--output", str(out), check=False)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    gate = json.loads((out / "gate.json").read_text())
    verdicts = {c["exporter"]: (c["verdict"], c["detail"]) for c in gate["cells"]}
    assert verdicts["dynamo"][0] == "new failure"
    assert "torch_2_11" in verdicts["dynamo"][1]
    assert verdicts["torchscript"][0] == "unchanged"
    md = (out / "gate.md").read_text()
    assert md.startswith("## Upgrade gate: onnxscript 0.6.0 → onnxscript 0.5.4: ❌ 1 regression")
    # The same two environments, driven directly: the change is onnxscript's.
    envs = {}
    for run in (tmp_path / "reports" / "runs").iterdir():
        for name, marker in json.loads((run / "run.json").read_text())["environments"].items():
            onnxscript = next(p for p in marker["installed"] if p.startswith("onnxscript=="))
            envs[onnxscript] = envs_dir() / name / "bin" / "python"
    direct = {v: subprocess.run([str(py), str(TESTS / "direct_onnxscript.py"), str(tmp_path / "m.onnx")],
                                capture_output=True, text=True).stdout for v, py in envs.items()}
    assert "max_abs" in direct["onnxscript==0.6.0"]
    assert "No module named 'onnxscript._framework_apis.torch_2_11'" in direct["onnxscript==0.5.4"]
