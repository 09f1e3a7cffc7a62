"""Night files (harness.store.nights) and what the history makes of them (harness.report.history),
on the real fixture runs: compact and lossless for what reports and the gate read, append-only,
the versions that changed between two nights named beside a change, freshness."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest
from helpers import BOTH, FIXTURES, HOSTILE

from harness.core.record import read_records
from harness.matrix.rules import ConfigError
from harness.report.history import build_history, changes, freshness, write_history_site
from harness.store.nights import read_night, read_nights
from harness.store.nights_append import append_failed_night, append_night

RUNS = FIXTURES / "runs"


def test_a_night_keeps_what_reports_and_the_gate_read_and_drops_logs_and_samples(tmp_path):
    path, written = append_night(RUNS / BOTH, tmp_path, "2026-11-01", outcome="success")
    assert written and path.name == "2026-11-01.json.gz"
    night = read_night(path)
    originals = {r.cell_id: r for r in read_records(RUNS / BOTH / "results.jsonl")}
    kept = night.to_records()
    assert len(kept) == len(originals) == 24
    for rec in kept:
        orig = originals[rec.cell_id]
        assert (rec.key, rec.torch, rec.status, rec.stage, rec.signature) == \
               (orig.key, orig.torch, orig.status, orig.stage, orig.signature)
        assert rec.latency_ms.median == orig.latency_ms.median and rec.parity.max_abs == orig.parity.max_abs
        assert rec.latency_ms.samples == [] and rec.log is None and rec.bundle is None
    assert night.environments["torch2.13.0-cpu-0b1efe24"]["onnxruntime"]
    assert path.stat().st_size < (RUNS / BOTH / "results.jsonl").stat().st_size / 5
    assert gzip.decompress(path.read_bytes()).startswith(b"{")


def test_nights_are_append_only(tmp_path):
    first, _ = append_night(RUNS / BOTH, tmp_path)
    assert append_night(RUNS / BOTH, tmp_path) == (first, False)           # the same run: no-op
    before = first.read_bytes()
    second, written = append_night(RUNS / HOSTILE, tmp_path)               # same date, another run
    assert written and second.name == first.name.replace(".json.gz", ".2.json.gz")
    assert first.read_bytes() == before
    with pytest.raises(ConfigError, match="already recorded"):
        append_night(RUNS / HOSTILE, tmp_path, first.name.split(".")[0])
    with pytest.raises(ConfigError, match="--night: expected a date"):
        append_night(RUNS / BOTH, tmp_path, "2026-13-01")
    with pytest.raises(ConfigError, match="--outcome"):
        append_night(RUNS / BOTH, tmp_path, "2026-11-09", outcome="green")
    unfinished = tmp_path / "run"
    shutil.copytree(RUNS / BOTH, unfinished)
    meta = json.loads((unfinished / "run.json").read_text())
    (unfinished / "run.json").write_text(json.dumps({**meta, "finished": False}))
    with pytest.raises(ConfigError, match="unfinished"):
        append_night(unfinished, tmp_path, "2026-11-10")
    assert [n.night for n in read_nights(tmp_path)] == [first.name[:10], first.name[:10] + ".2"]


def test_a_change_names_the_versions_that_moved_and_the_streaks_date_it(tmp_path):
    for day in ("2026-11-01", "2026-11-02", "2026-11-09"):
        append_night(RUNS / (HOSTILE if day == "2026-11-02" else BOTH), tmp_path, day, outcome="success")
    nights = read_nights(tmp_path)
    env = "torch2.13.0-cpu-0b1efe24"
    nights[1].environments[env] = {**nights[1].environments[env], "onnxruntime": "0.0.1"}
    history = build_history(nights)
    (crash,) = [c for c in changes(history, 0, 1) if c.after == "crash"]
    assert crash.key.case == "mha" and crash.torch == "2.13.0"
    assert f"onnxruntime {nights[0].environments[env]['onnxruntime']} → 0.0.1" in crash.versions
    cell = next(c for c in history.cells if c.cell_id == crash.cell_id)
    assert cell.strip == "pcp" and cell.first_failed == "2026-11-02" and cell.fixed == "2026-11-09"
    assert cell.days_in_state(nights[-1].date) == 0
    # Torch 2.6.0 cells were not in the hostile night: absent, their streak unbroken.
    old = next(c for c in history.cells if c.torch == "2.6.0" and c.status == "pass")
    assert old.strip == "p-p" and old.since == "2026-11-01" and old.days_in_state(nights[-1].date) == 8


def test_freshness(tmp_path):
    assert not freshness([]).ok and freshness([]).line() == "no night recorded yet"
    append_night(RUNS / BOTH, tmp_path, "2026-11-01", outcome="success")
    append_night(RUNS / HOSTILE, tmp_path, "2026-11-04", outcome="failure", url="https://ci/run/4")
    nights = read_nights(tmp_path)
    started = nights[-1].started
    fresh = freshness(nights, max_age_h=36, now=started + 3600)
    assert not fresh.stale and fresh.newest_failed and not fresh.ok
    assert fresh.missing == ["2026-11-02", "2026-11-03"]
    assert fresh.failed == [{"night": "2026-11-04", "outcome": "failure", "url": "https://ci/run/4"}]
    assert "its nightly ended: failure" in fresh.line()
    ok = freshness(nights[:1], max_age_h=36, now=nights[0].started + 3600)
    assert ok.ok and "1.0 h ago" in ok.line()
    assert freshness(nights[:1], max_age_h=36, now=nights[0].started + 37 * 3600).stale


def test_a_nightly_without_a_run_is_listed_as_failed_and_fails_the_check(tmp_path):
    append_night(RUNS / BOTH, tmp_path, "2026-11-01", outcome="success")
    append_night(RUNS / HOSTILE, tmp_path, "2026-11-02", outcome="success")
    path = append_failed_night(tmp_path, "failure", "https://ci/run/3", "2026-11-03")
    with pytest.raises(ConfigError, match="--outcome"):
        append_failed_night(tmp_path, "success")
    nights = read_nights(tmp_path)
    assert nights[-1].night == "2026-11-03" and nights[-1].records == [] and path.exists()
    fresh = freshness(nights, max_age_h=36, now=nights[1].started + 3600)
    assert fresh.newest == "2026-11-03" and fresh.newest_ran == "2026-11-02" and not fresh.ok
    assert "the 2026-11-03 nightly ended: failure" in fresh.line()
    history = build_history(nights)
    crash = next(c for c in history.cells if c.cell_id == "torch2.13.0-mha-dynamo-op18-ort-cpu")
    assert crash.strip == "pc-" and crash.status == "crash" and crash.first_failed == "2026-11-02"
    index = write_history_site(tmp_path, tmp_path / "site").read_text(encoding="utf-8")
    assert "2026-11-03 <span class=\"muted\">(no run)</span>" in index and 'href="https://ci/run/3"' in index
    assert not (tmp_path / "site" / "nights" / "2026-11-03.html").exists()
    assert (tmp_path / "site" / "nights" / "2026-11-02.html").exists()
    since_last = index.split('id="since-last"')[1].split("</section>")[0]
    assert "2026-11-01 → 2026-11-02" in since_last and "crash" in since_last
