"""The latency-protocol benchmark compares what it says: each protocol's process medians per cell,
their ratio, how far one protocol's processes lie apart, and the run's first latency job per
environment (times are reported by `nox -s bench`, never asserted here)."""
from __future__ import annotations

import json

import pytest

from harness.bench.latency_protocol import compare, first_latency_jobs


def _worker(wall: float, medians: dict[str, float], loaded: bool = False) -> dict:
    return {"wall_s": wall, "cpu_s": wall, "cells": {c: {"median": m, "iterations": 100, "loaded": loaded}
                                                    for c, m in medians.items()}}


def test_compare_reports_the_ratio_spread_and_agreement_per_protocol():
    before = [_worker(20.0, {"a": 1.0, "b": 2.0}), _worker(22.0, {"a": 1.1, "b": 2.0})]
    after = [_worker(11.0, {"a": 1.05, "b": 2.2, "c": 9.0}), _worker(12.0, {"a": 1.05, "b": 2.2})]
    out = compare({"before": before, "after": after}, tolerance=0.05)
    assert out["cells"] == 2                                 # only cells every worker timed
    old, new = out["protocols"]["before"], out["protocols"]["after"]
    assert old["wall_s"] == 21.0 and new["wall_s"] == 11.5 and out["wall_ratio"] == pytest.approx(11.5 / 21.0, abs=1e-3)
    assert old["pairs_agreeing"] == 0.5 and new["pairs_agreeing"] == 1.0   # a: 1.0 vs 1.1 is 10 % apart
    assert old["process_spread_median"] == pytest.approx((0.1 / 1.05 + 0.0) / 2, abs=1e-4)
    # per cell: the median of each protocol's process medians, after / before
    assert out["median_ratio"]["median"] == pytest.approx((1.05 / 1.05 + 2.2 / 2.0) / 2, abs=1e-4)


def test_the_first_latency_job_of_each_environment(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for n, env, phase in [(1, "e1", "verdicts"), (12, "e1", "latency"), (3, "e1", "latency"),
                          (4, "e2", "latency"), (10, "e2", "latency")]:
        (jobs / f"{env}-{n}.json").write_text(json.dumps({"phase": phase, "env": env, "n": n}))
    assert {e: j["n"] for e, j in first_latency_jobs(tmp_path).items()} == {"e1": 3, "e2": 4}
