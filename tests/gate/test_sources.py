"""Where a version-based gate side takes stored cells from: damaged runs are skipped, not fatal."""
from __future__ import annotations

from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.gate.sources import stored_records
from harness.matrix.config import Matrix
from harness.matrix.plan import build_plan

MATRIX = Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18],
                                "cases": ["conv_bn"]})
PRINT = {"harness": "0.1.0", "code": "x", "cases": {"conv_bn": "abc"}}


def _run(reports, run_id, started, lines=None, env=None):
    run_dir = reports / "runs" / run_id
    run_dir.mkdir(parents=True)
    meta = RunMeta(run_id=run_id, started=started, finished=True, fingerprint=PRINT)
    meta.write(run_dir)
    if lines is None:
        plan = build_plan(MATRIX)
        cell = plan.cells[0]
        env = env or plan.environments[0].env.name
        append_record(run_dir / "results.jsonl", Record.for_cell(run_id, cell.key, cell.torch, env, Status.PASS))
    else:
        (run_dir / "results.jsonl").write_text(lines)
    return run_dir


def test_a_damaged_run_is_skipped_with_a_warning(tmp_path, capsys):
    reports = tmp_path / "reports"
    _run(reports, "20260101-000000-aaaaaa", 1.0)
    _run(reports, "20260102-000000-aaaaaa", 2.0, lines='{"schema": "abc"}\n[1, 2, 3]\n')
    records, prints, _ = stored_records(build_plan(MATRIX), PRINT, reports)
    assert [r.run_id for r in records] == ["20260101-000000-aaaaaa"] and records[0].status is Status.PASS
    assert "skipping stored run 20260102-000000-aaaaaa" in capsys.readouterr().err


def test_a_cell_of_another_environment_is_not_reused(tmp_path):
    """Same cell id, another installed set (say another onnxscript pin): another cell."""
    reports = tmp_path / "reports"
    _run(reports, "20260101-000000-aaaaaa", 1.0, env="torch2.13.0-cpu-00000000")
    records, _, found = stored_records(build_plan(MATRIX), PRINT, reports)
    assert records == []
    (refusal,) = found.refusals
    assert refusal.reason == "ran in another environment than the one planned now (torch2.13.0-cpu-00000000)"


def test_a_version_side_says_and_records_every_stored_record_it_did_not_reuse(tmp_path, capsys):
    """The gate names what the store held for a side and why it ran the cells instead; gate.json
    lists each refusal with its fix."""
    import json

    from harness.gate.compare import Settings
    from harness.gate.output import render_json
    from harness.gate.sources import plan_version_side

    reports = tmp_path / "reports"
    _run(reports, "20260101-000000-aaaaaa", 1.0, env="torch2.13.0-cpu-00000000")
    config = tmp_path / "matrix.yaml"
    config.write_text("torch: ['2.13.0']\nexporters: [dynamo]\nopsets: [18]\ncases: [conv_bn]\n")
    pending = plan_version_side("2.13.0", MATRIX, config, reports, PRINT)
    assert len(pending.missing.cells) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "torch 2.13.0: 0 of 1 cell(s) from 1 stored run(s); not reused:" in err
    assert ("1 record(s) of 1 run(s) refused: ran in another environment than the one planned now "
            "(20260101-000000-aaaaaa); fix: a pin changed since") in err
    data = json.loads(render_json(pending.side, pending.side, [], Settings(), 0, PRINT))
    (listed,) = data["baseline"]["not_reused"]
    assert listed["run"] == "20260101-000000-aaaaaa" and listed["cell"] == "torch2.13.0-conv_bn-dynamo-op18-ort-cpu"
    assert listed["fix"].startswith("a pin changed since")
