"""Run-directory preparation: a new run, resuming an unfinished one, refusing a finished one."""
from __future__ import annotations

import hashlib
import json

import pytest

from harness.core.cell import CellKey
from harness.core.record import Record, append_record
from harness.core.status import Status
from harness.matrix.config import Matrix, matrix_hash
from harness.matrix.plan import build_plan
from harness.matrix.rules import ConfigError
from harness.store.rundir import finalize, prepare_run_dir, resumable_run
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
    with pytest.raises(ConfigError, match="immutable"):
        prepare_run_dir(run_dir, tmp_path / "reports", MATRIX, tmp_path / "m.yaml", plan, resume=False)
    assert CellKey("conv_bn", "dynamo", 18, "ort-cpu").cell_id("2.13.0") == cell.cell_id


OTHER = Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [17],
                               "cases": ["conv_bn"]})


def started(tmp_path, matrix=MATRIX):
    plan = build_plan(matrix)
    run_dir, meta, _ = prepare_run_dir(tmp_path / "run", tmp_path / "reports", matrix,
                                       tmp_path / "m.yaml", plan, resume=False)
    return plan, run_dir, meta


def test_resume_with_another_matrix_is_refused_naming_both_hashes(tmp_path):
    _, run_dir, meta = started(tmp_path)
    with pytest.raises(ConfigError) as info:
        prepare_run_dir(run_dir, tmp_path / "reports", OTHER, tmp_path / "other.yaml",
                        build_plan(OTHER), resume=False)
    text = str(info.value)
    assert matrix_hash(MATRIX) in text and matrix_hash(OTHER) in text and "other.yaml" in text
    assert "--force-resume" in text and not read_run_meta(run_dir).resumed


def test_force_resume_continues_with_the_new_matrix_and_says_so(tmp_path):
    _, run_dir, meta = started(tmp_path)
    prepare_run_dir(run_dir, tmp_path / "reports", OTHER, tmp_path / "other.yaml", build_plan(OTHER),
                    resume=False, force_resume=True)
    stored = read_run_meta(run_dir)
    assert stored.matrix_hash == matrix_hash(OTHER)
    (forced,) = stored.extra["forced_resumes"]
    assert forced["previous_matrix_hash"] == matrix_hash(MATRIX)


def test_resume_picks_the_newest_unfinished_run_of_the_same_matrix(tmp_path):
    reports = tmp_path / "reports"
    mine = reports / "runs" / "20260101-000000-aaaaaa"
    prepare_run_dir(mine, reports, MATRIX, tmp_path / "m.yaml", build_plan(MATRIX), resume=False)
    assert resumable_run(reports, matrix_hash(MATRIX), tmp_path / "m.yaml", False) == mine
    newer = reports / "runs" / "20260102-000000-bbbbbb"
    prepare_run_dir(newer, reports, OTHER, tmp_path / "o.yaml", build_plan(OTHER), resume=False)
    assert resumable_run(reports, matrix_hash(MATRIX), tmp_path / "m.yaml", False) == mine
    # Only runs of another matrix are unfinished: refused, unless forced.
    finalize(mine, read_run_meta(mine), reports)
    with pytest.raises(ConfigError, match=f"{matrix_hash(OTHER)}.*{matrix_hash(MATRIX)}"):
        resumable_run(reports, matrix_hash(MATRIX), tmp_path / "m.yaml", False)
    assert resumable_run(reports, matrix_hash(MATRIX), tmp_path / "m.yaml", True) == newer


def test_resume_cuts_a_torn_tail_and_reruns_that_cell(tmp_path, capsys):
    plan, run_dir, meta = started(tmp_path, Matrix.model_validate(
        {"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [17, 18], "cases": ["conv_bn"]}))
    first, second = plan.cells
    results = run_dir / "results.jsonl"
    append_record(results, Record.for_cell(meta.run_id, first.key, first.torch, "env", Status.PASS))
    size = results.stat().st_size
    with open(results, "a") as fh:
        fh.write(Record.for_cell(meta.run_id, second.key, second.torch, "env", Status.PASS).to_json()[:50])
    _, _, done = prepare_run_dir(run_dir, tmp_path / "reports", plan.matrix, tmp_path / "m.yaml", plan,
                                 resume=False)
    assert done == {first.cell_id}                        # the torn cell runs again
    assert results.stat().st_size == size
    assert f"{results}: cut a torn last line at byte {size}" in capsys.readouterr().err.replace("\n", "")


def test_resume_refuses_a_corrupt_line_in_the_middle(tmp_path):
    plan, run_dir, meta = started(tmp_path)
    results = run_dir / "results.jsonl"
    results.write_text('{"status": "weird"}\n')
    cell = plan.cells[0]
    append_record(results, Record.for_cell(meta.run_id, cell.key, cell.torch, "env", Status.PASS))
    with pytest.raises(ConfigError, match=r"cannot resume .*results.jsonl:1: 'run_id' is missing"):
        prepare_run_dir(run_dir, tmp_path / "reports", MATRIX, tmp_path / "m.yaml", plan, resume=False)


def test_new_keys_at_their_default_keep_the_matrix_hash():
    """Runs stored before cell_memory_mb, log_max_mb, reduce, dim_policy, determinism, jobs, the
    runtime release keys, the latency confirmation, pipelines and the exporter switches existed
    resume with the same hash."""
    before = {k: v for k, v in MATRIX.model_dump(mode="json").items()
              if k not in ("cell_memory_mb", "log_max_mb", "reduce", "reduce_timeout_s", "jobs", "determinism",
                           "runtime_versions", "runtime_floor", "deploy", "pipelines")}
    before["options"] = {k: v for k, v in before["options"].items() if k not in ("dim_policy", "optimize", "external_data")}
    before["torch"] = [{k: v for k, v in t.items() if k not in ("image", "onnxslim", "onnxsim")} for t in before["torch"]]
    before["latency"] = {k: v for k, v in before["latency"].items() if k not in ("confirm", "confirm_processes")}
    before["cases"] = [{k: v for k, v in c.items() if k not in ("data_files", "tolerances")} for c in before["cases"]]
    old_hash = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert matrix_hash(MATRIX) == old_hash
    assert matrix_hash(MATRIX.model_copy(update={"cell_memory_mb": 1000})) != old_hash
    declared = MATRIX.model_copy(update={"cases": [MATRIX.cases[0].model_copy(update={"data_files": ["w/*"]})]})
    assert matrix_hash(declared) != old_hash
    assert matrix_hash(MATRIX.model_copy(update={"determinism": True})) != old_hash
    assert matrix_hash(MATRIX.model_copy(update={"pipelines": {"raw": [], "slim": ["onnxslim"]}})) != old_hash
    # jobs says how a run is scheduled, never what it finds: a run resumes with another jobs.
    assert matrix_hash(MATRIX.model_copy(update={"jobs": 7})) == old_hash


@pytest.mark.parametrize("records", [0, 1])
def test_a_new_run_that_fails_before_any_record_leaves_nothing(tmp_path, monkeypatch, records):
    """An unexpected error before the first record: the run this process started is removed (an
    empty unfinished run is no use to a gate or a report); one with a record is kept."""
    from harness.run import execute as ex
    from harness.run.context import RunRequest

    plan = build_plan(MATRIX)

    def broken(request, run, jobs):
        run_dir, meta = run.run_dir, run.meta
        if records:
            cell = plan.cells[0]
            append_record(run_dir / "results.jsonl",
                          Record.for_cell(meta.run_id, cell.key, cell.torch, "env", Status.PASS))
        (run_dir / "logs" / "worker.log").write_text("started\n")
        raise RuntimeError("provider broke")

    monkeypatch.setattr(ex, "_execute", broken)
    reports = tmp_path / "reports"
    with pytest.raises(RuntimeError, match="provider broke"):
        ex.execute(RunRequest(MATRIX, tmp_path / "m.yaml", plan, reports))
    left = list((reports / "runs").iterdir())
    if records:
        assert len(left) == 1 and not read_run_meta(left[0]).finished
    else:
        assert left == []
    # An --output folder the user made keeps whatever else it holds.
    (tmp_path / "mine" / "logs").mkdir(parents=True)
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "mine" / "logs" / "my.log").write_text("mine")
    with pytest.raises(RuntimeError):
        ex.execute(RunRequest(MATRIX, tmp_path / "m.yaml", plan, reports, tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "mine" / "logs" / "my.log").read_text() == "mine"
    assert ((tmp_path / "mine" / "run.json").exists()) == bool(records)
    if not records:
        assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["logs", "notes.txt"]
