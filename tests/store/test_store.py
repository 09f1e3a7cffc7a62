"""The results store: run directories, the index, the latest pointer, report-only writes, one
runner per run directory, and readers that refuse corrupt files with file:line (exit 2)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import BOTH, FIXTURES, HOSTILE, OLD, ROOT, make_store, run_harness

from harness.core.record import SchemaError
from harness.matrix.rules import ConfigError
from harness.store.runs import (
    RunDirBusy,
    cell_log_path,
    list_runs,
    load_run,
    read_index,
    resolve_run,
    run_dir_lock,
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


def test_a_run_directory_has_one_runner_at_a_time(tmp_path):
    run = tmp_path / "run"
    with run_dir_lock(run):
        holder = json.loads((run / ".runner.json").read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunDirBusy, match=rf"in use by another runner \(pid {os.getpid()} on "):
            with run_dir_lock(run):
                pass
    with run_dir_lock(run):      # released with its holder
        pass
    assert not (run / ".runner.json").exists()


def test_the_lock_dies_with_its_process(tmp_path):
    """A runner killed with SIGKILL leaves no stale lock: the kernel drops its flock."""
    run = tmp_path / "run"
    code = ("import sys, os; from pathlib import Path; from harness.store.runs import run_dir_lock\n"
            f"with run_dir_lock(Path({str(run)!r})): os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT)
    assert proc.returncode == -9 and (run / ".runner.json").exists()   # its holder file stays...
    with run_dir_lock(run):                                             # ...but not the lock
        pass


def test_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="must be a directory"):
        with run_dir_lock(tmp_path / "f"):
            pass


@pytest.mark.parametrize("content, why", [
    ("{", "not valid JSON"),
    ("[1, 2]", "not a run's metadata"),
    ('{"run_id": "x", "schema": "abc"}', "'schema' must be an integer"),
    ('{"run_id": "x", "finished": "yes"}', "'finished' must be true or false"),
    ('{"run_id": "x", "environments": []}', "'environments' must be an object"),
])
def test_an_invalid_run_json_is_a_schema_error(tmp_path, content, why):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "runs" / BOTH, run)
    (run / "run.json").write_text(content)
    with pytest.raises(SchemaError, match=why):
        load_run(run)


def test_an_invalid_index_is_a_schema_error(tmp_path):
    store = make_store(tmp_path)
    (store / "index.json").write_text("{ nope")
    with pytest.raises(SchemaError, match="index.json: not valid JSON"):
        read_index(store)
    (store / "index.json").write_text('{"schema": 1, "runs": [1, {"run_id": "a"}]}')
    assert read_index(store) == []      # entries that are not runs are not listed


@pytest.mark.parametrize("line", ["[1,2,3]", "DUPLICATE"])
def test_report_on_a_corrupt_run_is_one_line_and_exit_2(tmp_path, line):
    store = make_store(tmp_path)
    run = store / "runs" / BOTH
    lines = (run / "results.jsonl").read_text().splitlines()
    bad = lines[0] if line == "DUPLICATE" else line
    (run / "results.jsonl").write_text("\n".join([*lines[:5], bad, *lines[5:]]) + "\n")
    proc = run_harness("report", str(run), "--reports", str(store), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (message,) = proc.stderr.strip().splitlines()
    assert message.startswith(f"error: {run / 'results.jsonl'}:6: ")


def test_run_ids_are_unique_across_stores_and_sort_by_time(tmp_path):
    """Two runs of one matrix in one second (one per store, or in a loop) get distinct ids;
    ids sort by time as text, after the ids of earlier releases (kept and read as they are)."""
    import re
    import time

    from harness.store.runs import claim_new_run, list_runs, new_run_id

    ids = [new_run_id("ca9e5d0123") for _ in range(50)]   # most of them in one millisecond
    assert len(set(ids)) == 50
    assert all(re.fullmatch(r"\d{8}-\d{9}-ca9e5d-[0-9a-f]{6}", i) for i in ids)
    a, _ = claim_new_run(tmp_path / "store-a", "ca9e5d0123")
    b, _ = claim_new_run(tmp_path / "store-b", "ca9e5d0123")
    assert a != b
    time.sleep(0.002)
    later = new_run_id("ffffff")
    assert sorted([later, a, b])[-1] == later
    # Old ids of the same second and earlier sort before new ones; every reader takes both.
    store = make_store(tmp_path / "mixed")
    old = sorted(p.name for p in list_runs(store))
    new_id, new_dir = claim_new_run(store, "0bad00")
    shutil.copy(store / "runs" / old[0] / "run.json", new_dir / "run.json")
    assert [p.name for p in list_runs(store)] == [*old, new_id]
    assert resolve_run(old[0], store).name == old[0] and resolve_run(new_id, store) == new_dir


def test_a_finished_run_json_is_never_written_again(tmp_path):
    """Everything a run records in run.json is known before it finishes (a shard's identity
    included): finalizing writes it the last time, and any later write is refused."""
    from harness.core.run import FinishedRun, RunMeta
    from harness.store.rundir import finalize

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.jsonl").write_text("")
    meta = RunMeta.start("r1", "0.1.0", tmp_path / "m.yaml", "hash", {})
    meta.extra["shard"] = {"index": 1}
    meta.write(run_dir)
    meta.write(run_dir)                      # an unfinished run is written as it goes
    finalize(run_dir, meta, tmp_path / "reports")
    before = (run_dir / "run.json").read_bytes()
    assert json.loads(before)["finished"] is True and json.loads(before)["shard"] == {"index": 1}
    meta.extra["shard"] = {"index": 2}
    with pytest.raises(FinishedRun, match="immutable"):
        meta.write(run_dir)
    with pytest.raises(FinishedRun):
        RunMeta(run_id="r1").write(run_dir)   # not only the object that finished it
    assert (run_dir / "run.json").read_bytes() == before
