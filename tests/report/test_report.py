"""Markdown report and aggregation, rendered from checked-in fixture runs (tests/fixtures/runs/).

The fixtures are trimmed real runs (tests/fixtures/trim_run.py): an older torch 2.6.0 run stored in
schema 0, a torch 2.6.0 + 2.13.0 run, and a hostile copy whose texts carry HTML and script.
Set HARNESS_UPDATE_REFERENCE=1 to rewrite tests/fixtures/expected/ after an intended change.
"""
from __future__ import annotations

import json
import shutil

from helpers import BOTH, FIXTURES, HOSTILE, OLD, check_reference

from harness.core.record import read_records
from harness.report.aggregate import (
    history,
    pivot,
    previous_run,
    records_frame,
    status_changes,
    summary,
)
from harness.report.html import write_reports
from harness.store.runs import load_run


def test_markdown_matches_reference(store):
    run = store / "runs" / BOTH
    meta, records = load_run(run)
    md = write_reports(run, records, meta, store)
    text = md.read_text(encoding="utf-8")
    check_reference("matrix.md", text)
    check_reference("matrix.html", md.with_suffix(".html").read_text(encoding="utf-8"))
    assert "## Changes since the previous run" in text and f"`{OLD}`" in text
    assert "#### torch 2.6.0 → 2.13.0" in text  # conv_bn/dynamo starts passing on the bump


def test_schema0_fixture_is_migrated(store):
    raw = (store / "runs" / OLD / "results.jsonl").read_text().splitlines()
    assert all("result" in json.loads(line) and "status" not in json.loads(line) for line in raw)
    records = read_records(store / "runs" / OLD / "results.jsonl")
    assert {r.schema for r in records} == {1}
    assert {r.status for r in records} == {"pass", "fail"}
    assert all(r.latency_ms.median for r in records if r.status == "pass")
    meta, _ = load_run(store / "runs" / OLD)
    text = write_reports(store / "runs" / OLD, records, meta, store).read_text()
    assert "**12 cells**" in text and "No earlier run in the store shares cells" in text


def test_changes_name_cells_whose_status_changed(store):
    meta, records = load_run(store / "runs" / HOSTILE)
    prev_meta, prev = previous_run(meta, records_frame(records), store)
    assert prev_meta.run_id == BOTH  # newest earlier run sharing cells (torch 2.13.0)
    changes = status_changes(prev, records_frame(records))
    assert changes[["case", "exporter", "opset", "before", "after"]].values.tolist() == [
        ["mha", "dynamo", 18, "pass", "crash"]]
    text = (write_reports(store / "runs" / HOSTILE, records, meta, store)).read_text()
    assert "#### torch 2.13.0" in text and "✅ pass" in text and "💥 crash (run)" in text


def test_pivot_and_summaries_by_any_axis(store):
    _, records = load_run(store / "runs" / BOTH)
    df = records_frame(records)
    table = pivot(df, ["case", "exporter", "opset"], "torch")
    assert list(table.columns) == ["2.6.0", "2.13.0"]  # version order, not string order
    assert table.loc[("conv_bn", "dynamo", 13)].tolist() == ["fail", "pass"]
    by_runtime = pivot(df, "case", "runtime", values="latency", aggfunc="median")
    assert by_runtime.loc["mha", "ort-cpu"] > 0
    per_torch = summary(df, "torch")
    assert per_torch.loc["2.13.0", "cells"] == 12 and per_torch.loc["2.13.0", "pass_rate"] == 0.75
    for axis in ("exporter", "opset", "runtime", "case"):
        assert summary(df, axis)["cells"].sum() == len(df)


def test_history_is_pass_rate_per_torch_across_runs(store):
    hist = history(store)
    assert hist["run_id"].tolist()[:1] == [OLD]
    rates = {(r.run_id, r.torch): round(r.pass_rate, 3) for r in hist.itertuples()}
    assert rates[(OLD, "2.6.0")] == round(7 / 12, 3)
    assert rates[(BOTH, "2.13.0")] == 0.75 and (HOSTILE, "2.13.0") in rates


def test_history_counts_runs_indexed_without_per_torch_counts(store):
    index = json.loads((store / "index.json").read_text())
    for entry in index["runs"]:
        entry.pop("by_torch")
    (store / "index.json").write_text(json.dumps(index))
    assert len(history(store)) == 4


def test_report_of_a_run_outside_the_store(tmp_path):
    run = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    meta, records = load_run(run)
    text = write_reports(run, records, meta, None).read_text()
    assert "No earlier run in the store shares cells" in text
    assert (run / "matrix.html").exists() and (run / "plots" / "latency.svg").exists()
