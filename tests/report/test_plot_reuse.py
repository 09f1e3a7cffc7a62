"""An unchanged re-run takes its plots from the earlier run that drew them from the same data;
a change to anything plotted draws them again (the fixture store's real runs, real matplotlib)."""
from __future__ import annotations

import shutil

import pytest
from helpers import BOTH, make_store

from harness.report import html
from harness.report.html import run_plots, write_reports
from harness.store.runs import load_run

NAMES = ("latency", "parity")


@pytest.fixture
def store(tmp_path):
    return make_store(tmp_path)


def _copy(store, name: str):
    """A second run of the store with the same records (what an unchanged re-run writes)."""
    src, dst = store / "runs" / BOTH, store / "runs" / name
    dst.mkdir()
    for f in ("run.json", "results.jsonl"):
        shutil.copy(src / f, dst / f)
    return dst


def _svgs(run):
    return {n: (run / "plots" / f"{n}.svg").read_text() for n in NAMES}


def _counting(monkeypatch):
    drawn = []
    for name, draw in list(html.PLOTS.items()):
        monkeypatch.setitem(html.PLOTS, name, lambda df, name=name, draw=draw: drawn.append(name) or draw(df))
    return drawn


def test_an_unchanged_rerun_draws_nothing_and_shows_the_same_plots(store, monkeypatch):
    first = store / "runs" / BOTH
    meta, records = load_run(first)
    drawn = _counting(monkeypatch)
    write_reports(first, records, meta, store)
    assert sorted(drawn) == sorted(NAMES)            # nothing earlier had these: drawn
    second = _copy(store, "20991231-000000000-rerun")
    write_reports(second, records, meta, store)
    assert sorted(drawn) == sorted(NAMES)            # taken from the first run, not drawn again
    assert _svgs(second) == _svgs(first)
    # What was taken is what a fresh drawing gives, byte for byte.
    fresh, _ = run_plots(records)
    assert {n: fresh[n] for n in NAMES} == _svgs(second)


def test_a_changed_latency_draws_the_plots_again(store, monkeypatch):
    first = store / "runs" / BOTH
    meta, records = load_run(first)
    write_reports(first, records, meta, store)
    timed = [r for r in records if r.latency_ms.median and r.status.value == "pass"]
    # Below every other figure: the plot shows each line's best opset, so this one is drawn.
    timed[0].latency_ms.median = min(r.latency_ms.median for r in timed) / 10
    drawn = _counting(monkeypatch)
    second = _copy(store, "20991231-000000000-changed")
    write_reports(second, records, meta, store)
    assert sorted(drawn) == sorted(NAMES)
    assert _svgs(second)["latency"] != _svgs(first)["latency"]
    assert (second / "plots" / "latency.key").read_text() != (first / "plots" / "latency.key").read_text()
