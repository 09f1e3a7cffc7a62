"""Run-directory preparation: a new run, resuming an unfinished one, refusing a finished one."""
from __future__ import annotations

import pytest

from harness.core.cell import CellKey
from harness.core.record import Record, append_record
from harness.core.status import Status
from harness.matrix.config import Matrix
from harness.matrix.plan import build_plan
from harness.run.execute import finalize, prepare_run_dir
from harness.store.runs import read_run_meta

MATRIX = Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18],
                                "cases": ["conv_bn"]})


def test_new_run_dir_records_plan_and_provenance(tmp_path):
    plan = build_plan(MATRIX)
    run_dir, meta, done = prepare_run_dir(tmp_path / "run", tmp_path / "reports", MATRIX,
                                          tmp_path / "m.yaml", plan, resume=False)
    assert done == set() and (run_dir / "logs").is_dir()
    stored = read_run_meta(run_dir)
    assert stored.run_id == meta.run_id and not stored.finished
    assert stored.plan["cells"] == len(plan.cells) and stored.fingerprint["cases"]["conv_bn"]


def test_resume_keeps_recorded_cells_and_a_finished_run_is_immutable(tmp_path):
    plan = build_plan(MATRIX)
    run_dir, meta, _ = prepare_run_dir(tmp_path / "run", tmp_path / "reports", MATRIX,
                                       tmp_path / "m.yaml", plan, resume=False)
    cell = plan.cells[0]
    append_record(run_dir / "results.jsonl",
                  Record.for_cell(meta.run_id, cell.key, cell.torch, "env", Status.PASS))
    again, meta2, done = prepare_run_dir(run_dir, tmp_path / "reports", MATRIX, tmp_path / "m.yaml",
                                         plan, resume=False)
    assert again == run_dir and meta2.run_id == meta.run_id and done == {cell.cell_id}
    assert len(meta2.resumed) == 1
    finalize(run_dir, meta2, tmp_path / "reports")
    assert read_run_meta(run_dir).counts["pass"] == 1
    with pytest.raises(SystemExit, match="immutable"):
        prepare_run_dir(run_dir, tmp_path / "reports", MATRIX, tmp_path / "m.yaml", plan, resume=False)
    assert CellKey("conv_bn", "dynamo", 18, "ort-cpu").cell_id("2.13.0") == cell.cell_id
