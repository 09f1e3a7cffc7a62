"""Bisect across torch releases: the search with an injected release list and verdict function,
the release list, cell selection, and the command over stored runs (nothing is installed)."""
from __future__ import annotations

import math

import pytest
from helpers import TESTS

from harness.core.cell import CellKey
from harness.core.record import Record
from harness.core.status import Status
from harness.gate import bisect as bisect_mod
from harness.gate.bisect import (
    bisect,
    final_releases,
    releases_between,
    select_keys,
    verdict_of,
)
from harness.matrix.config import load_matrix
from harness.matrix.rules import ConfigError

RELEASES = ["2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0"]


def counting(verdicts: dict[str, str | None]):
    calls = []

    def verdict(v: str) -> str | None:
        calls.append(v)
        return verdicts[v]
    return verdict, calls


def test_regression_found_between_adjacent_releases_in_log_steps():
    verdict, calls = counting({v: "pass" if v in ("2.6.0", "2.7.0", "2.7.1") else "fail (check)"
                               for v in RELEASES})
    search = bisect(releases_between(RELEASES, "2.6.0", "2.13.0"), verdict)
    assert search.boundary == ("2.7.1", "2.8.0") and search.found
    assert len(calls) == len(set(calls)) <= 2 + math.ceil(math.log2(len(RELEASES)))
    assert search.verdicts["2.7.1"] == "pass" and search.verdicts["2.8.0"] == "fail (check)"


def test_fix_is_found_with_good_newer_than_bad():
    verdict, _ = counting({v: "fail (check)" if v in ("2.6.0", "2.7.0", "2.7.1") else "pass" for v in RELEASES})
    versions = releases_between(RELEASES, "2.13.0", "2.6.0")
    assert versions[0] == "2.13.0" and versions[-1] == "2.6.0"
    search = bisect(versions, verdict)
    assert search.boundary == ("2.7.1", "2.8.0")        # older first, whichever the direction
    assert search.last_good == "2.8.0" and search.first_bad == "2.7.1"


def test_same_verdict_on_both_ends_is_nothing_to_bisect():
    search = bisect(RELEASES, lambda v: "pass")
    assert search.boundary is None and "nothing to bisect" in search.note


def test_untestable_releases_are_stepped_over():
    truth = {v: "pass" if v in ("2.6.0", "2.7.0", "2.7.1") else "fail (run)" for v in RELEASES}
    truth["2.8.0"] = None                               # e.g. its environment cannot be built
    search = bisect(RELEASES, lambda v: truth[v])
    assert search.boundary == ("2.7.1", "2.9.0") and "untestable releases in between: 2.8.0" in search.note
    truth = dict(truth, **{"2.8.0": "fail (run)", "2.9.1": None})
    assert bisect(RELEASES, lambda v: truth[v]).boundary == ("2.7.1", "2.8.0")


def test_verdicts_compared():
    key = CellKey("c", "dynamo", 13, "ort-cpu")
    rec = lambda status, **kw: Record.for_cell("r", key, "2.9.0", "e", status, **kw)
    assert verdict_of(rec(Status.PASS)) == verdict_of(rec(Status.XPASS)) == "pass"
    assert verdict_of(rec(Status.FAIL, stage="check")) == verdict_of(rec(Status.XFAIL, stage="check")) == "fail (check)"
    assert verdict_of(rec(Status.CRASH, error="SIGSEGV")) == "crash"
    assert verdict_of(rec(Status.SKIP)) is None and verdict_of(None) is None
    assert verdict_of(rec(Status.CRASH, error="EnvironmentBuildError: no wheel")) is None
    missing = "ModuleNotFoundError: No module named 'onnxscript._framework_apis.torch_2_8'"
    assert verdict_of(rec(Status.FAIL, stage="export", error=missing)) is None


def test_release_list_keeps_final_releases_between_the_ends():
    assert final_releases(["2.9.0", "2.10.0rc1", "2.13.0+cpu", "2.8.0.post1", "2.7.0", "x"]) == ["2.7.0", "2.9.0"]
    assert releases_between(RELEASES, "2.9.0", "2.11.0") == ["2.9.0", "2.9.1", "2.10.0", "2.11.0"]
    assert releases_between(["2.13.0"], "2.6.0", "2.13.0") == ["2.6.0", "2.13.0"]   # ends always


def test_cell_named_by_id_key_or_name():
    matrix = load_matrix(TESTS / "matrices" / "gate.yaml")
    config = TESTS / "matrices" / "gate.yaml"
    one = select_keys(matrix, "2.6.0", "torch2.13.0-conv_bn-dynamo-op17-ort-cpu", config)
    assert one == select_keys(matrix, "2.6.0", "conv_bn-dynamo-op17-ort-cpu", config)
    assert one == select_keys(matrix, "2.6.0", "conv_bn · dynamo · op17 · ort-cpu", config)
    assert len(one) == 1 and one[0].opset == 17
    assert len(select_keys(matrix, "2.6.0", None, config)) == 6
    with pytest.raises(ConfigError, match="no cell 'conv_bn-dynamo-op99-ort-cpu'"):
        select_keys(matrix, "2.6.0", "conv_bn-dynamo-op99-ort-cpu", config)


def test_run_bisect_prints_the_change_and_the_notes_link(tmp_path, monkeypatch):
    truth = {v: "fail (check)" if v in ("2.6.0", "2.7.0", "2.7.1") else "pass" for v in RELEASES}
    tried = []

    def records(self, version, matrix=None, label=None):
        tried.append(label or version)   # label: the boundary again with the older pins (gate.swap)
        return {k: Record.for_cell("r", k, version, "e", Status.PASS if truth[version] == "pass" else Status.FAIL,
                                   stage=None if truth[version] == "pass" else "check") for k in self.keys}

    monkeypatch.setattr(bisect_mod.Bisector, "records", records)
    monkeypatch.setattr(bisect_mod.Bisector, "check_installable", lambda self, releases: None)
    lines = []
    rc = bisect_mod.run_bisect(bisect_mod.BisectRequest(
        "2.13.0", "2.6.0", TESTS / "matrices" / "gate.yaml", tmp_path, "conv_bn-dynamo-op17-ort-cpu", RELEASES),
        lines.append)
    text = "\n".join(lines)
    assert rc == 0, text
    assert "verdict changes between 2.7.1 and 2.8.0 (fail (check) → pass)" in text
    assert "https://github.com/pytorch/pytorch/releases/tag/v2.8.0" in text
    # The verdict here is torch's: 2.8.0 with 2.7.1's companion pins still passes.
    assert "the change that flipped it: torch 2.7.1 → 2.8.0 (torch 2.8.0 with 2.7.1's pins" in text
    assert len(tried) == len(set(tried)) < len(RELEASES)
    with pytest.raises(ConfigError, match="--bad"):
        bisect_mod.run_bisect(bisect_mod.BisectRequest("2.13.0", "two", TESTS / "matrices" / "gate.yaml", tmp_path))
