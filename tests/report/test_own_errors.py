"""The matrix's own failures (status `error`) and the requested opset as a promise, through the
records' readers: report, overview, advisor, gate, bisect, history, the run summary."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace

from helpers import BOTH, FIXTURES

from harness.core.cell import CellKey
from harness.core.record import Latency, Parity, Record, read_records
from harness.core.status import Status
from harness.gate.bisect import verdict_of
from harness.gate.compare import Settings, Verdict, compare_cell
from harness.report.advise import advice_lines, advise, losses
from harness.report.aggregate import records_frame, summary

OWN = "OwnError: the matrix's own code failed generating the second-shape inputs from the example"


def _with_an_error(tmp_path):
    """The fixture run with one cell turned into the matrix's own error."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec.update(status="error", stage="reference", error=OWN, reason="this is the matrix's fault", hint=None,
               signature=None, latency_ms={}, parity={})
    lines[0] = json.dumps(rec, sort_keys=True)
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    return run, rec["cell_id"]


def test_an_error_is_counted_apart_in_both_reports(tmp_path):
    from harness.report.html import write_reports
    from harness.store.runs import load_run

    run, cell_id = _with_an_error(tmp_path)
    meta, records = load_run(run)
    md = write_reports(run, records, meta, None).read_text(encoding="utf-8")
    assert "🛠️ error 1" in md and "🛠️ error: the matrix's own code failed (no verdict on the model)" in md
    assert "## The matrix's own errors" in md and f"`{cell_id}`" in md and OWN[:60] in md
    assert "**1 cells have no verdict: the matrix's own code failed on them**" in md
    failures = md.split("## Failures by signature", 1)[1].split("##", 1)[0]
    assert cell_id not in failures                     # never a failure of the model
    html = (run / "matrix.html").read_text(encoding="utf-8")
    assert "<h2>The matrix's own errors</h2>" in html and ".s-error" in html and cell_id in html
    rates = summary(records_frame(records), "torch")
    torch = next(r for r in records if r.cell_id == cell_id).torch
    assert rates.loc[torch, "error"] == 1
    # the pass rate is over attempts: the error is not one
    ran = [r for r in records if r.torch == torch and r.status.attempted]
    assert rates.loc[torch, "pass_rate"] == round(sum(r.status.passed for r in ran) / len(ran), 3)


def test_a_run_without_errors_renders_without_a_word_of_them(tmp_path):
    from harness.report.html import write_reports
    from harness.store.runs import load_run

    meta, records = load_run(FIXTURES / "runs" / BOTH)
    run = tmp_path / "copy"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    md = write_reports(run, records, meta, None).read_text(encoding="utf-8")
    assert "error" not in md.split("## Matrix", 1)[0] and "own errors" not in md
    assert ".s-error" not in (run / "matrix.html").read_text(encoding="utf-8")


def test_the_run_summary_names_the_errors_apart(tmp_path):
    from harness.cli.commands.matrix import summary as run_summary

    run, cell_id = _with_an_error(tmp_path)
    (run / "matrix.md").write_text("")
    lines = run_summary(run)
    assert lines[0].endswith("error 1") or " error 1" in lines[0]
    assert any("the matrix's own code failed on them" in line for line in lines)
    assert any(line.strip().startswith(cell_id) for line in lines)
    assert not any("× " in line and cell_id in line for line in lines)   # not among the failures


def _rec(torch="2.13.0", status=Status.PASS, opset=13, actual=13, median=1.0, case="m"):
    return Record.for_cell("r", CellKey(case, "dynamo", opset, "ort-cpu"), torch, "env", status,
                           opset_actual=actual, latency_ms=Latency(median=median),
                           parity=Parity(max_abs=1e-6, atol=1e-4), error=OWN if status is Status.ERROR else None)


def test_the_gate_and_bisect_take_no_verdict_from_an_error():
    key = CellKey("m", "dynamo", 13, "ort-cpu")
    cell = compare_cell(key, _rec("2.6.0"), _rec(status=Status.ERROR), Settings(), True)
    assert cell.verdict is Verdict.NOT_COMPARABLE and not cell.verdict.blocking
    assert cell.detail.startswith("the matrix's own error on candidate: OwnError")
    assert verdict_of(_rec(status=Status.ERROR)) is None and verdict_of(_rec()) == "pass"


def test_a_file_of_another_opset_is_never_the_requested_configuration():
    """Asked 13, got 18: it passes on a runtime that reads 18, but it is no opset-13 configuration."""
    other = _rec(actual=18, median=0.5)
    kept = _rec(torch="2.6.0", median=2.0)
    assert other.opset_mark == "asked 13, got 18" and kept.opset_mark is None and kept.opset_kept
    (adv,) = advise([other, kept])
    assert [c.record.torch for c in adv.ranked] == ["2.6.0"] and adv.other_opset == [other]
    assert any("not counted: 1 passing cell(s) whose file declares another opset than asked (opset asked 13, "
               "got 18)" in line for line in advice_lines(adv))
    # a release whose only passing cells broke the promise loses the runtime
    lost = losses([kept, other])
    assert [(x.torch, x.before) for x in lost] == [("2.13.0", "2.6.0")]
    # the gate: kept before, broken now, is a new failure of the requested opset
    key = CellKey("m", "dynamo", 13, "ort-cpu")
    cell = compare_cell(key, kept, other, Settings(), True)
    assert cell.verdict is Verdict.NEW_FAILURE and cell.detail == "opset not kept: asked 13, got 18 (the baseline's file declares 13)"
    back = compare_cell(key, other, kept, Settings(), True)
    assert back.verdict is not Verdict.NEW_FAILURE and any("keeps opset 13" in n for n in back.notes)
    both = compare_cell(key, other, _rec(actual=18), Settings(), True)
    assert both.verdict is Verdict.UNCHANGED and both.notes == []
    # a known failure (xfail entry) whose cell now runs at another opset is still that known failure
    known = replace(other, status=Status.XPASS, reason="cannot convert down")
    still = compare_cell(key, kept, known, Settings(), True)
    assert still.verdict is Verdict.XFAIL and "asked 13, got 18" in still.detail and not still.verdict.blocking
    really = compare_cell(key, kept, replace(kept, status=Status.XPASS, reason="stale"), Settings(), True)
    assert really.verdict is Verdict.XPASS


def test_error_cells_are_never_attempts_for_the_advisor():
    (adv,) = advise([_rec(status=Status.ERROR), _rec(torch="2.6.0")])
    assert adv.attempted == 1 and len(adv.ranked) == 1


def test_the_history_check_fails_on_a_night_with_errors_and_keeps_the_night(tmp_path):
    from harness.report.history import build_history, freshness
    from harness.store.nights import read_nights
    from harness.store.nights_append import append_night

    run, cell_id = _with_an_error(tmp_path)
    append_night(run, tmp_path / "nights", "2026-11-01", outcome="success")
    nights = read_nights(tmp_path / "nights")
    fresh = freshness(nights, max_age_h=36, now=nights[-1].started + 3600)
    assert fresh.own_errors == 1 and not fresh.ok and not fresh.stale
    assert "1 of its cells have no verdict: the matrix's own code failed on them" in fresh.line()
    cell = next(c for c in build_history(nights).cells if c.cell_id == cell_id)
    assert cell.strip == "e" and cell.first_failed is None
    clean = tmp_path / "clean"
    append_night(FIXTURES / "runs" / BOTH, clean, "2026-11-01", outcome="success")
    ok = read_nights(clean)
    assert freshness(ok, max_age_h=36, now=ok[-1].started + 3600).ok
    assert len(read_records(run / "results.jsonl")) == 24
