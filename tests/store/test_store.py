"""The results store: run directories, the index, the latest pointer, report-only writes."""
from __future__ import annotations

import json
import shutil

import pytest
from helpers import BOTH, FIXTURES, HOSTILE, OLD, make_store

from harness.core.record import SchemaError
from harness.store.runs import (
    cell_log_path,
    list_runs,
    load_run,
    read_index,
    resolve_run,
    update_index,
    write_report_file,
)


def test_index_lists_runs_oldest_first_with_per_torch_counts(tmp_path):
    store = make_store(tmp_path)
    entries = read_index(store)
    assert [e["run_id"] for e in entries] == [OLD, BOTH, HOSTILE]
    both = entries[1]
    assert both["dir"] == f"runs/{BOTH}" and both["torch"] == ["2.13.0", "2.6.0"]
    assert both["by_torch"] == {"2.6.0": {"passed": 7, "cells": 12}, "2.13.0": {"passed": 9, "cells": 12}}
    assert both["counts"]["pass"] == 16 and both["counts"]["fail"] == 8


def test_latest_is_a_relative_link_to_the_newest_run(tmp_path):
    store = make_store(tmp_path)
    latest = store / "latest"
    assert latest.is_symlink() and not latest.readlink().is_absolute()
    assert latest.resolve() == (store / "runs" / HOSTILE).resolve()
    # Re-indexing an older run keeps the pointer on the newest one.
    update_index(store / "runs" / OLD, store)
    assert resolve_run("latest", store).resolve() == (store / "runs" / HOSTILE).resolve()
    assert [e["run_id"] for e in read_index(store)] == [OLD, BOTH, HOSTILE]


def test_resolve_run_by_id_path_and_latest(tmp_path):
    store = make_store(tmp_path)
    assert resolve_run(BOTH, store) == store / "runs" / BOTH
    assert resolve_run(str(store / "runs" / OLD), store) == store / "runs" / OLD
    with pytest.raises(FileNotFoundError, match="no run 'nope'"):
        resolve_run("nope", store)


def test_runs_outside_the_store_are_not_indexed(tmp_path):
    store = make_store(tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.copytree(FIXTURES / "runs" / BOTH, outside)
    update_index(outside, store)
    assert len(read_index(store)) == 3 and len(list_runs(store)) == 3


def test_newer_index_and_run_metadata_are_refused(tmp_path):
    store = make_store(tmp_path)
    (store / "index.json").write_text(json.dumps({"schema": 9, "runs": []}))
    with pytest.raises(SchemaError, match="upgrade"):
        read_index(store)
    meta_path = store / "runs" / OLD / "run.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "schema": 9}))
    with pytest.raises(SchemaError, match="upgrade"):
        load_run(store / "runs" / OLD)


def test_only_report_files_can_be_written(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    results = (run / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="never rewritten"):
        write_report_file(run, "results.jsonl", "")
    with pytest.raises(ValueError):
        write_report_file(run, "run.json", "{}")
    assert (run / "results.jsonl").read_bytes() == results
    assert write_report_file(run, "plots/parity.svg", "<svg/>").read_text() == "<svg/>"


def test_cell_logs_are_found_after_the_run_moved(tmp_path):
    run = tmp_path / "moved"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    _, records = load_run(run)
    failed = next(r for r in records if r.status == "fail")
    assert cell_log_path(run, failed) == run / "logs" / failed.log.split("/")[-1]
    assert cell_log_path(run, next(r for r in records if r.status == "pass")) is None  # not kept
