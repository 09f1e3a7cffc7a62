"""Decoding-step cases end to end (tests/matrices/decoding.yaml: torch 2.6.0 and 2.13.0, both
exporters, ort-cpu): a KV cache of past length 0, a mask from triu(past + 1), a batch-1 example,
position ids from an attention mask. Every verdict and every dim the file fixes is compared with
a plain export-and-run that uses no harness code (tests/direct_verdict.py) in the same
environment; what the records say about the files is checked against the files themselves."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import TESTS, env_python, run_matrix

pytestmark = pytest.mark.e2e

CASES = TESTS / "cases" / "decoding.py"
FIXED = re.compile(r"^(\w+) was fixed to (\d+) by the exporter \((\w+) dim (\d+)\)$")


@pytest.fixture(scope="module")
def decoding_run(tmp_path_factory) -> Path:
    # HARNESS_DECODING_RUN_DIR: a finished run of this matrix to reuse while developing.
    reuse = os.environ.get("HARNESS_DECODING_RUN_DIR")
    if reuse and (Path(reuse) / "run.json").exists():
        return Path(reuse)
    return run_matrix(tmp_path_factory, "decoding", "decoding.yaml")


@pytest.fixture(scope="module")
def records(decoding_run):
    from harness.core.record import read_records

    return read_records(decoding_run / "results.jsonl")


@pytest.fixture(scope="module")
def meta(decoding_run):
    return json.loads((decoding_run / "run.json").read_text())


def one(records, **axes):
    found = [r for r in records if all(str(getattr(r, k)) == str(v) for k, v in axes.items())]
    assert len(found) == 1, (axes, [r.cell_id for r in found])
    return found[0]


@pytest.fixture(scope="module")
def direct(meta, records, tmp_path_factory) -> dict[str, dict]:
    out: dict[str, dict] = {}
    tmp = tmp_path_factory.mktemp("direct-decoding")
    for torch_version in ("2.6.0", "2.13.0"):
        items = [{"case_file": str(CASES), "case_fn": r.case, "exporter": r.exporter, "opset": r.opset,
                  "cell_id": r.cell_id} for r in records if r.torch == torch_version]
        job, result = tmp / f"{torch_version}.json", tmp / f"{torch_version}.jsonl"
        job.write_text(json.dumps(items))
        proc = subprocess.run([str(env_python(meta, torch_version)), str(TESTS / "direct_verdict.py"), str(job),
                               str(result)], capture_output=True, text=True, cwd=TESTS, timeout=1500,
                              env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"}, check=False)
        rows = [json.loads(line) for line in result.read_text().splitlines()] if result.exists() else []
        assert len(rows) == len(items), proc.stderr[-3000:]
        out.update({row["cell_id"]: row for row in rows})
    return out


def test_every_planned_cell_has_one_record(records):
    assert len(records) == 4 * 2 * 2 and len({r.cell_id for r in records}) == len(records)


def test_verdicts_and_fixed_dims_match_a_direct_export_and_run(records, direct):
    mismatches = [(r.cell_id, (r.status.value, r.stage), r.error, (d["status"], d["stage"]), d["error"])
                  for r in records for d in [direct[r.cell_id]] if (r.status.value, r.stage) != (d["status"], d["stage"])]
    assert not mismatches
    for r in records:
        noted = {(m.group(3), int(m.group(4)), int(m.group(2))) for n in r.notes if (m := FIXED.match(n))}
        in_file = {(name, int(axis), value) for name, axes in (direct[r.cell_id].get("fixed") or {}).items()
                   for axis, value in axes.items()}
        assert noted == in_file, r.cell_id


def test_the_first_decoding_step_is_checked_at_a_second_shape(records):
    """The issue's first model: a cache of past length 0 failed every cell at reference."""
    for r in (r for r in records if r.case == "empty_cache"):
        assert r.stage != "reference", (r.cell_id, r.error)
        if r.status.passed:
            assert r.parity.shapes[1]["inputs"]["input_1"] == [3, 2, 1, 16]
    assert one(records, torch="2.13.0", case="empty_cache", exporter="dynamo").status == "pass"


def test_torch_2_6_fixes_past_by_a_silent_re_export_and_the_record_says_where(records):
    r = one(records, torch="2.6.0", case="triu_mask", exporter="dynamo")
    assert (r.status, r.stage) == ("fail", "run")
    (fact,) = r.graph["export_specialised"]
    assert (fact["dim"], fact["value"], fact["how"]) == ("past", 3, "re-exported")
    assert fact["source"].endswith(".triu(past + 1)") and "decoding.py:" in fact["source"]
    note = next(n for n in r.notes if n.startswith("torch.onnx exported the model again"))
    assert "past was inferred to be a constant (3) at " in note and "arange comparisons" in note
    assert "arange comparisons" in r.hint and "mark that dim dynamic" not in r.hint
    assert r.blame.party == "model-code" and r.blame.source == fact["source"]


@pytest.mark.parametrize("case,dim,value", [("empty_cache", "past", 0), ("batch_one_step", "batch", 1)])
def test_an_example_size_of_zero_or_one_is_named_with_its_fix(records, case, dim, value):
    r = one(records, torch="2.6.0", case=case, exporter="dynamo")
    assert (r.status, r.stage) == ("fail", "run")
    assert f"{dim} was fixed to {value} by the exporter" in " ".join(r.notes)
    assert f"give an example with {dim} >= 2" in r.hint
    assert r.blame.party == "model-code"


CHECK_SYMBOLS = """
import importlib.util, sys
import numpy as np, onnxruntime as ort, torch
spec = importlib.util.spec_from_file_location("cases", sys.argv[1]); cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
model, (ids, key, value), _ = cases.triu_mask()
sess = ort.InferenceSession(sys.argv[2] + "/model.onnx", providers=["CPUExecutionProvider"])
for batch, seq in ((3, 3), (2, 5), (4, 1)):   # past stays at the 3 the file fixes
    torch.manual_seed(batch)
    x = (torch.randint(0, 64, (batch, seq)), torch.randn(batch, 2, 3, 16), torch.randn(batch, 2, 3, 16))
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), x)})
    for g, e in zip(got, model(*x)):
        np.testing.assert_allclose(g, e.detach().numpy(), atol=1e-4, rtol=1e-3)
print("runs at other batch and seq")
"""


def test_dims_named_by_digits_are_symbols_and_the_file_keeps_them_dynamic(records, meta):
    """torch 2.6 names batch '2' and seq '3' in the file: no note calls them fixed, and the very
    file (the failing cell's bundle) runs and matches eager at other batch and seq sizes."""
    r = one(records, torch="2.6.0", case="triu_mask", exporter="dynamo")
    dims = {d for d, _ in (FIXED.match(n).group(1, 2) for n in r.notes if FIXED.match(n))}
    assert dims == {"past"}
    assert any(n.startswith("batch is named '2' in the file") for n in r.notes)
    shapes = {i["name"]: i["shape"] for i in r.graph["io"]["inputs"]}
    assert shapes["input_0"] == ["2", "3"] and shapes["input_1"][2] == 3
    proc = subprocess.run([str(env_python(meta, "2.6.0")), "-c", CHECK_SYMBOLS, str(CASES), r.bundle],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0 and "runs at other batch and seq" in proc.stdout, proc.stderr[-2000:]


def test_the_noise_floor_is_recorded_and_a_runtime_sits_near_it(records):
    passing = [r for r in records if r.status == "pass"]
    assert passing
    for r in passing:
        assert r.parity.noise["method"] == "float64" and r.parity.noise["judged"] is True, r.cell_id
        assert r.parity.noise["ratio"] < 10, (r.cell_id, r.parity.noise)
