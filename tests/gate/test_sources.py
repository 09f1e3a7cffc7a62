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
    records, prints = stored_records(build_plan(MATRIX), PRINT, reports)
    assert [r.run_id for r in records] == ["20260101-000000-aaaaaa"] and records[0].status is Status.PASS
    assert "skipping stored run 20260102-000000-aaaaaa" in capsys.readouterr().err


def test_a_cell_of_another_environment_is_not_reused(tmp_path):
    """Same cell id, another installed set (say another onnxscript pin): another cell."""
    reports = tmp_path / "reports"
    _run(reports, "20260101-000000-aaaaaa", 1.0, env="torch2.13.0-cpu-00000000")
    records, _ = stored_records(build_plan(MATRIX), PRINT, reports)
    assert records == []
