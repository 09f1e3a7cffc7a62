"""The zoo end to end on torch 2.13.0 × ort-cpu (tests/matrices/zoo_e2e.yaml): bert, gpt2, t5,
whisper, vit, llama, swin and gpt_oss (the last two fail with dynamo on 2.13.0: a baked spatial
size, data-dependent expert routing) with the user's dynamo export and Optimum's exporter, each
verdict checked against tests/direct_zoo.py (transformers, Optimum, torch.onnx and ONNX Runtime,
no harness code); Optimum's own validation kept in the record; other cases skipped with a reason.
"""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import TESTS, env_python, run_matrix

from harness.core.record import read_records
from harness.core.status import Status
from harness.probes.zoo import TRANSFORMERS_JSON
from harness.store.runs import load_run

pytestmark = pytest.mark.e2e
ARCHITECTURES = ["bert", "gpt2", "t5", "whisper", "vit", "llama", "swin", "gpt_oss"]


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "zoo", "zoo_e2e.yaml")


@pytest.fixture(scope="module")
def records(zoo_run):
    return {(r.case, r.exporter): r for r in read_records(zoo_run / "results.jsonl")}


@pytest.fixture(scope="module")
def direct(zoo_run, tmp_path_factory):
    meta, _ = load_run(zoo_run)
    out = tmp_path_factory.mktemp("direct") / "verdicts.jsonl"
    proc = subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "direct_zoo.py"),
                           str(TRANSFORMERS_JSON), str(out), *ARCHITECTURES],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {(v["model_type"], v["exporter"]): v for v in map(json.loads, out.read_text().splitlines())}


@pytest.mark.parametrize("exporter", ["dynamo", "optimum"])
@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_verdict_matches_a_direct_export(records, direct, model_type, exporter):
    rec, ref = records[(f"hf-{model_type}", exporter)], direct[(model_type, exporter)]
    assert rec.status.value == ref["status"], (rec.error, ref["error"])
    assert rec.stage == ref["stage"], (rec.error, ref["error"])


def test_optimum_cells_keep_optimums_own_validation(records):
    entries = json.loads(TRANSFORMERS_JSON.read_text())["architectures"]
    for model_type in ARCHITECTURES:
        rec = records[(f"hf-{model_type}", "optimum")]
        if rec.stage == "export":
            continue
        validation = rec.graph["optimum_validation"]
        assert isinstance(validation["ok"], bool) and validation["atol"] > 0
        assert rec.graph["optimum_export"]["task"] == "feature-extraction"
        # Optimum names the graph's inputs and outputs; the harness kept them.
        assert rec.graph["outputs"] == entries[model_type]["outputs"]
        disagree = validation["ok"] != (rec.status is Status.PASS)
        assert disagree == any("Optimum's validation" in n for n in rec.notes)


def test_zoo_cases_carry_optimums_names_and_tolerance(records):
    entries = json.loads(TRANSFORMERS_JSON.read_text())["architectures"]
    bert = records[("hf-bert", "dynamo")]
    if bert.status is Status.PASS:
        assert bert.graph["inputs"] == list(entries["bert"]["inputs"])
        assert bert.parity.atol == entries["bert"]["atol"] and bert.parity.rtol == 1e-5
        assert {s["inputs"]["input_ids"][1] for s in bert.parity.shapes} == {16, 17}


def test_other_cases_skip_the_optimum_exporter_with_the_reason(records):
    mha = records[("mha", "optimum")]
    assert mha.status is Status.SKIP and "transformers architectures" in mha.reason
    assert records[("mha", "dynamo")].status is not Status.SKIP
    resnet = records[("timm-resnet", "dynamo")]
    assert resnet.status is Status.SKIP and "torchvision" in resnet.reason and "+cpu" in resnet.reason


def test_architectures_view_is_rendered(zoo_run):
    md = (zoo_run / "matrix.md").read_text()
    assert "## Architectures" in md and "torch 2.13.0: dynamo exports" in md
    assert "| hf-bert " in md
    assert 'id="architectures-section"' in (zoo_run / "matrix.html").read_text()
