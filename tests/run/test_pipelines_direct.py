"""Each built-in step through the matrix and through tests/direct_pipelines.py (the same library
calls, no code of the matrix) on two models that are not the matrix's probes: the same pass or
failure per step, the same fusion counts, the same parity class on ONNX Runtime CPU."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import TESTS, env_python, run_matrix

from harness.core.record import Record
from harness.core.run import RunMeta

pytestmark = pytest.mark.e2e


def _class(rec: Record) -> str:
    if rec.status.value == "pass":
        return "pass"
    return rec.stage or rec.status.value


def test_the_matrix_and_a_plain_script_agree_on_every_step(tmp_path_factory, tmp_path):
    run = Path(run_matrix(tmp_path_factory, "pipelines-direct", "pipelines_direct.yaml"))
    records = [Record.from_dict(json.loads(x)) for x in (run / "results.jsonl").read_text().splitlines()]
    meta = RunMeta.from_dict(json.loads((run / "run.json").read_text()))
    out = tmp_path / "direct.json"
    proc = subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "direct_pipelines.py"), str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    direct = json.loads(out.read_text())
    assert len(records) == len(direct) == 2 * 9
    fused_somewhere = False
    for rec in records:
        step = rec.options["pipeline"]
        mine, theirs = _class(rec), direct[f"{rec.case}/{step}"]
        assert mine == theirs["verdict"], (rec.cell_id, rec.error, theirs)
        if step == "ort-fusion" and mine == "pass":
            fused = rec.graph["pipeline"]["steps"][0]["fused"]
            assert fused == theirs["fused"], rec.cell_id
            fused_somewhere = fused_somewhere or any(fused.values())
    assert fused_somewhere   # the comparison of fusion counts compared something
