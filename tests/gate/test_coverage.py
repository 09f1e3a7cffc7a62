"""The gate never says "no regression" about nothing: exit 2 when no cell was comparable, when a
side is an unfinished run, or when less than --min-compared of the cells on both sides were
compared; the summary always says how many were compared."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers import BOTH, TESTS

from harness.cli import main
from harness.core.record import append_records, read_records
from harness.core.status import Status
from harness.gate.compare import CellComparison, Coverage, Verdict
from harness.store.runs import read_run_meta, update_index

GATE = TESTS / "matrices" / "gate.yaml"
COPY = "20261130-000000-c0ffee"


def copy_run(store: Path, edit=lambda rec: rec, finished: bool = True) -> str:
    """A copy of the fixture run BOTH under another id, each record passed through ``edit``."""
    src, dst = store / "runs" / BOTH, store / "runs" / COPY
    shutil.copytree(src, dst)
    records = [edit(dataclasses.replace(r, run_id=COPY)) for r in read_records(src / "results.jsonl")]
    (dst / "results.jsonl").unlink()
    append_records(dst / "results.jsonl", [r for r in records if r is not None])
    meta = read_run_meta(dst)
    meta.run_id, meta.finished = COPY, finished
    (dst / "run.json").unlink()          # a finished run.json is never written over
    meta.write(dst)
    update_index(dst, store)
    return COPY


@pytest.fixture
def gate(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_ENVS_DIR", str(tmp_path / "envs"))

    def run(*args: str) -> tuple[int, str, list[str]]:
        out = tmp_path / "gate"
        shutil.rmtree(out, ignore_errors=True)
        rc = main(["--reports", str(store), "gate", "--config", str(GATE), "--remeasure", "0",
                   "--output", str(out), *args])
        err = capsys.readouterr().err.strip().splitlines()
        md = (out / "gate.md").read_text(encoding="utf-8") if (out / "gate.md").exists() else ""
        return rc, md, err

    return run


def test_the_same_results_twice_compare_every_cell_and_pass(gate, store):
    run = copy_run(store)
    rc, md, _ = gate("--baseline", f"{BOTH}@2.13.0", "--candidate", f"{run}@2.13.0")
    assert rc == 0 and "✅ no regression" in md and "**12 of 12 cells compared**" in md


def test_a_baseline_of_another_matrix_compares_nothing_and_exits_2(gate, store):
    run = copy_run(store, lambda r: dataclasses.replace(r, case=f"other_{r.case}", cell_id=""))
    rc, md, err = gate("--baseline", f"{run}@2.13.0", "--candidate", f"{BOTH}@2.13.0")
    assert rc == 2 and "no cell was comparable" in md and "no regression" not in md
    assert any("cannot tell: no cell was comparable" in line for line in err), err


def test_cells_that_are_all_not_comparable_exit_2(gate, store):
    # Every cell's case files differ between the runs: the two sides ran different case code.
    run = copy_run(store, lambda r: dataclasses.replace(r, case_files={"models.py": "0" * 16}))
    rc, md, _ = gate("--baseline", f"{BOTH}@2.13.0", "--candidate", f"{run}@2.13.0")
    assert rc == 0   # the fixture's records have no case_files: nothing says they differ
    shutil.rmtree(store / "runs" / run)
    other = copy_run(store, lambda r: dataclasses.replace(r, case_files={"models.py": "1" * 16}))
    assert other == run
    first = store / "runs" / BOTH / "results.jsonl"
    records = [dataclasses.replace(r, case_files={"models.py": "0" * 16}) for r in read_records(first)]
    first.unlink()
    append_records(first, records)
    rc, md, err = gate("--baseline", f"{BOTH}@2.13.0", "--candidate", f"{run}@2.13.0")
    assert rc == 2 and "no cell was comparable: 12 of 12 not comparable (12 files the case loaded differ" in md


def test_an_unfinished_run_is_not_a_side(gate, store):
    run = copy_run(store, finished=False)
    rc, md, err = gate("--baseline", f"{run}@2.13.0", "--candidate", f"{BOTH}@2.6.0")
    assert rc == 2 and len(err) == 1 and f"run {run} is not finished" in err[0], err


def test_less_than_min_compared_exits_2_and_the_share_is_an_option(gate, store):
    def edit(rec):
        if (rec.case, rec.exporter, rec.opset, rec.torch) == ("mha", "torchscript", 13, "2.13.0"):
            return dataclasses.replace(rec, status=Status.SKIP, stage=None, reason="package missing")
        return rec
    run = copy_run(store, edit)
    rc, md, err = gate("--baseline", f"{BOTH}@2.13.0", "--candidate", f"{run}@2.13.0")
    assert rc == 2 and "only 11 of 12 cells were compared (92%, --min-compared 100%)" in md, md
    assert "1 skipped on candidate" in md
    rc, md, _ = gate("--baseline", f"{BOTH}@2.13.0", "--candidate", f"{run}@2.13.0", "--min-compared", "90%")
    assert rc == 0 and "**11 of 12 cells compared**" in md
    rc, _, err = gate("--baseline", f"{BOTH}@2.13.0", "--candidate", f"{run}@2.13.0", "--min-compared", "1.5")
    assert rc == 2 and "--min-compared" in err[-1]


def _cmp(base_status, cand_status, verdict):
    from harness.core.cell import CellKey
    from harness.core.record import Record

    key = CellKey("c", "dynamo", 18, "ort-cuda")
    rec = lambda s: Record.for_cell("r", key, "2.13.0", "e", s)
    return CellComparison(key, verdict, rec(base_status), rec(cand_status))


def test_cells_skipped_on_both_sides_are_not_expected_but_a_gate_of_only_those_cannot_tell():
    both = [_cmp(Status.SKIP, Status.SKIP, Verdict.NOT_COMPARABLE)] * 3
    cov = Coverage.of(both)
    assert (cov.compared, cov.expected, cov.skipped_both) == (0, 0, 3)
    assert "no cell was comparable" in cov.problem(1.0)
    mixed = both + [_cmp(Status.PASS, Status.PASS, Verdict.UNCHANGED)]
    assert Coverage.of(mixed).problem(1.0) is None and Coverage.of(mixed).summary() == (
        "1 of 1 cells compared; 3 skipped on both sides")
    assert json.dumps(Coverage.of(mixed).why_not) == "{}"


def test_a_baseline_that_shares_1_of_n_cells_is_1_of_n_not_100_percent(gate, store):
    """Coverage counts the cells either side planned: a baseline run holding one of the
    candidate's 12 cells used to pass as "1 of 1 cells compared"."""
    kept = "torch2.13.0-mha-dynamo-op18-ort-cpu"
    run = copy_run(store, lambda r: r if r.cell_id == kept else None)
    rc, md, err = gate("--baseline", f"{run}@2.13.0", "--candidate", f"{BOTH}@2.13.0")
    assert rc == 2 and "**1 of 12 cells compared**" in md and "no regression" not in md, md
    said = " ".join(err)
    assert "only 1 of 12 cells were compared" in said and "11 no result on baseline" in said, err
    rc, md, _ = gate("--baseline", f"{run}@2.13.0", "--candidate", f"{BOTH}@2.13.0", "--min-compared", "5%")
    assert rc == 0 and "**1 of 12 cells compared**" in md


def test_a_cell_skipped_on_the_only_side_that_has_it_is_not_expected():
    from harness.core.cell import CellKey
    from harness.core.record import Record

    key = CellKey("c", "dynamo", 18, "ort-cuda")
    skip = Record.for_cell("r", key, "2.13.0", "e", Status.SKIP)
    lone = CellComparison(key, Verdict.NOT_COMPARABLE, skip, None, "no result on candidate")
    cov = Coverage.of([lone, _cmp(Status.PASS, Status.PASS, Verdict.UNCHANGED)])
    assert (cov.compared, cov.expected, cov.skipped_both) == (1, 1, 1)
