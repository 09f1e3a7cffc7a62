"""The advisor (harness.report.advise): the best passing configuration per case and runtime.

The end-to-end tests read the session's e2e run (tests/matrices/e2e.yaml, no run of their own):
a script with no project code (tests/direct_advise.py) computes the fastest passing
configuration of every case and runtime, and the advisor must name the same cell; the export
call it prints, executed with torch, must give a file that matches eager.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import TESTS, env_python, run_harness

from harness.core.cell import CellKey
from harness.core.record import Latency, Parity, Record, read_records
from harness.core.status import Status
from harness.report.advise import advice_markdown, advise, losses


def _rec(torch, exporter="dynamo", opset=18, status=Status.PASS, median=1.0, max_abs=1e-6, size=1000,
         case="m", runtime="ort-cpu"):
    return Record.for_cell("r", CellKey(case, exporter, opset, runtime), torch, "env", status,
                           latency_ms=Latency(median=median), parity=Parity(max_abs=max_abs, atol=1e-4),
                           graph={"bytes": size})


def test_the_rule_fastest_then_margin_then_size_then_newer_torch():
    recs = [_rec("2.6.0", opset=13, median=1.0), _rec("2.6.0", opset=17, median=0.9, status=Status.FAIL),
            _rec("2.13.0", opset=13, median=1.0, max_abs=5e-7), _rec("2.13.0", opset=17, median=1.0, max_abs=5e-7, size=900),
            _rec("2.9.1", opset=17, median=1.0, max_abs=5e-7, size=900), _rec("2.13.0", opset=18, median=None)]
    (adv,) = advise(recs)
    order = [(c.record.torch, c.record.opset) for c in adv.ranked]
    # The failing 0.9 ms cell never counts; a cell without latency comes last.
    assert order == [("2.13.0", 17), ("2.9.1", 17), ("2.13.0", 13), ("2.6.0", 13), ("2.13.0", 18)]
    assert adv.attempted == 6 and len(adv.ranked) == 5


def test_a_release_that_leaves_nothing_to_ship_is_a_loss():
    recs = [_rec("2.6.0"), _rec("2.9.1", status=Status.FAIL), _rec("2.9.1", opset=17, status=Status.SKIP),
            _rec("2.13.0", status=Status.FAIL),
            _rec("2.6.0", runtime="openvino", status=Status.FAIL), _rec("2.13.0", runtime="openvino")]
    lost = losses(recs)
    # 2.13.0 fails too, but 2.9.1 before it had nothing either: only 2.9.1 loses ort-cpu.
    assert [(x.torch, x.runtime, x.before, x.attempted) for x in lost] == [("2.9.1", "ort-cpu", "2.6.0", 1)]
    text = advice_markdown(recs)
    assert "## Which configuration to ship" in text and "| 2.9.1 | m | ort-cpu | 2.6.0 |" in text


@pytest.mark.e2e
def test_the_advisor_names_the_fastest_passing_configuration_of_a_real_run(e2e_run):
    proc = subprocess.run([sys.executable, str(TESTS / "direct_advise.py"), str(e2e_run / "results.jsonl")],
                          capture_output=True, text=True, check=True)
    direct = json.loads(proc.stdout)
    records = read_records(e2e_run / "results.jsonl")
    mine = {f"{a.case}|{a.runtime}": a for a in advise(records)}
    assert set(mine) == set(direct) and len(direct) >= 5
    with_pass = 0
    for key, expected in direct.items():
        adv = mine[key]
        assert len(adv.ranked) == expected["passing"], key
        if expected["median"] is None:
            assert adv.best is None or adv.best.latency_ms is None, key
            continue
        with_pass += 1
        assert adv.best.record.cell_id in expected["cells"], (key, adv.best.record.cell_id, expected)
        assert adv.best.latency_ms == expected["median"]
    assert with_pass >= 3          # the e2e run has cases that pass and a case that passes nowhere
    assert any(d["passing"] == 0 for d in direct.values())
    # The command line says the same for one case, and refuses an unknown one in one line.
    case = "tiny_mlp"
    out = run_harness("advise", "--case", case, "--run", str(e2e_run)).stdout
    assert f"cell {direct[case + '|ort-cpu']['cells'][0]}" in out and "torch.onnx.export(model, " in out
    bad = run_harness("advise", "--case", "no_such_case", "--run", str(e2e_run), check=False)
    assert bad.returncode == 2 and "--case: no case 'no_such_case'" in bad.stderr and "tiny_mlp" in bad.stderr
    md = (e2e_run / "matrix.md").read_text()
    assert "## Which configuration to ship" in md and "| shape_branch | ort-cpu | none of" in md
    assert "Which configuration to ship" in (e2e_run / "matrix.html").read_text()


CHECK_CALL = """
import json, sys
import numpy as np, onnxruntime as ort, torch
sys.path.insert(0, sys.argv[1])
from user_models import tiny_mlp
rec = json.loads(open(sys.argv[2]).read())
model, args, _ = tiny_mlp()
names = [io["name"] for io in rec["graph"]["io"]["inputs"]]
x = {n: a.numpy() for n, a in zip(names, args)}
exec(rec["graph"]["export_call"], {"torch": torch, "model": model, "x": x})
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
batch = np.random.default_rng(0).standard_normal((5, 12)).astype(np.float32)  # another batch: dims stay dynamic
(got,) = sess.run(None, {names[0]: batch})
np.testing.assert_allclose(got, model(torch.from_numpy(batch)).detach().numpy(), atol=1e-4, rtol=1e-3)
print("matches eager")
"""


def test_the_recorded_export_call_exports_a_file_that_matches_eager(e2e_run, e2e_meta, tmp_path):
    """The call as recorded (torch 2.13.0, dynamo with torch.export dims), executed as a user
    would in the run's own torch 2.13.0 environment: no project code."""
    rec = next(r for r in read_records(e2e_run / "results.jsonl") if r.case == "tiny_mlp" and r.torch == "2.13.0"
               and r.exporter == "dynamo" and r.status.passed and r.opset == 18)
    call = rec.graph["export_call"]
    assert "from torch.export import Dim" in call and "dynamic_shapes=" in call
    (tmp_path / "rec.json").write_text(json.dumps(rec.to_dict()))
    proc = subprocess.run([str(env_python(e2e_meta, "2.13.0")), "-c", CHECK_CALL, str(TESTS / "cases"),
                           str(tmp_path / "rec.json")], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and "matches eager" in proc.stdout, proc.stderr[-3000:]


# -- a store read from another folder, holding two different cases of one name ----------------------
def _stored_run(reports, run_id: str, repo, source: str, opset: int, median: float, base_dir: bool = True):
    """A finished run of ``repo``'s matrix in ``reports``: case ``net`` from ``repo/cases.py``
    (its file recorded relative to the matrix folder, as the runner records it)."""
    from harness.core.files import file_digest
    from harness.core.record import append_records
    from harness.core.run import RunMeta
    from harness.store.runs import update_index

    repo.mkdir(exist_ok=True)
    (repo / "cases.py").write_text(source)
    run = reports / "runs" / run_id
    run.mkdir(parents=True)
    meta = RunMeta(run_id=run_id, started=float(opset), ended=float(opset) + 1, finished=True, config="m.yaml",
                   fingerprint={"harness": "0.1.0", "code": "c", "cases": {"net": file_digest(repo / "cases.py")}},
                   base_dir=str(repo) if base_dir else None)
    rec = _rec("2.13.0", opset=opset, median=median, case="net")
    rec.run_id, rec.case_files = run_id, {"cases.py": file_digest(repo / "cases.py")}
    append_records(run / "results.jsonl", [rec])
    meta.write(run)
    update_index(run, reports)


def test_advise_from_another_folder_reads_each_run_against_its_own_matrix_folder(tmp_path):
    """Case files resolve against the run's matrix folder, not the working directory; a run from
    before the folder was recorded resolves its config against the store's folder."""
    repo = tmp_path / "repo"
    reports = repo / "reports"
    _stored_run(reports, "20260101-000000-aaaaaa", repo, "def net(): ...\n", 17, 2.0, base_dir=False)
    _stored_run(reports, "20260101-000001-aaaaaa", repo, "def net(): ...\n", 18, 1.0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run_harness("advise", "--case", "net", "--store", str(reports), cwd=elsewhere).stdout
    assert "from 2 finished run(s)" in out and "2 of 2 configuration(s) pass" in out, out
    assert "ship: torch 2.13.0 · dynamo · opset 18" in out
    # A case file changed since: its records are refused, and the refusal says why.
    (repo / "cases.py").write_text("def net(): return 2\n")
    bad = run_harness("advise", "--case", "net", "--store", str(reports), cwd=elsewhere, check=False)
    assert bad.returncode == 2 and "in 2 finished run(s)" in bad.stderr, bad.stderr
    assert "2 record(s) of 2 run(s) refused: files its case loaded changed since" in bad.stderr, bad.stderr


def test_two_different_cases_of_one_name_are_never_ranked_together(tmp_path):
    reports = tmp_path / "a" / "reports"
    _stored_run(reports, "20260101-000000-aaaaaa", tmp_path / "a", "def net(): return 'a'\n", 17, 2.0)
    _stored_run(reports, "20260101-000001-bbbbbb", tmp_path / "b", "def net(): return 'b'\n", 18, 1.0)
    out = run_harness("advise", "--case", "net", "--store", str(reports), cwd=tmp_path).stdout
    assert "2 different cases are named net here" in out, out
    assert out.count("1 of 1 configuration(s) pass") == 2 and "2 of 2" not in out
    assert "opset 17" in out and "opset 18" in out
