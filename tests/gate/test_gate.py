"""The upgrade gate over real results: gating a torch bump backwards (2.13.0 → 2.6.0) is a real
source of regressions, forwards a real source of fixes.

One module-scoped gate runs tests/matrices/gate.yaml against an empty store, so it runs both torch
versions itself and stores them; later gates reuse those runs (by version or by run id).
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import TESTS, run_harness

from harness.core.cell import CellKey
from harness.core.record import Record
from harness.gate.compare import Settings, Verdict, compare_cell

pytestmark = pytest.mark.e2e

GATE = TESTS / "matrices" / "gate.yaml"
GATE_XFAIL = TESTS / "matrices" / "gate_xfail.yaml"
NO_LATENCY = ("--latency-threshold", "inf")  # status-only gates: real timings may differ by version
FAILED = {"fail", "crash", "timeout"}


@dataclass
class GateResult:
    rc: int
    out: Path
    data: dict
    stdout: str

    def keys(self, verdict: Verdict) -> set[tuple]:
        return {(c["case"], c["exporter"], c["opset"], c["runtime"]) for c in self.data["cells"]
                if c["verdict"] == verdict.value}


def gate(store: Path, out: Path, *args: str, config: Path = GATE) -> GateResult:
    proc = run_harness("--reports", str(store), "gate", "--config", str(config), "--output", str(out),
                       *args, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return GateResult(proc.returncode, out, json.loads((out / "gate.json").read_text()), proc.stdout)


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> GateResult:
    root = tmp_path_factory.mktemp("gate")
    return gate(root / "reports", root / "first", "--baseline", "2.13.0", "--candidate", "2.6.0")


@pytest.fixture(scope="module")
def store(first) -> Path:
    return first.out.parent / "reports"


def raw_results(store: Path, run_id: str) -> dict[tuple, str]:
    """Status per cell read straight from results.jsonl, independently of the gate's code."""
    return {k: r["status"] for k, r in _raw(store, run_id).items()}


def _raw(store: Path, run_id: str) -> dict[tuple, dict]:
    out = {}
    for line in (store / "runs" / run_id / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[(r["case"], r["exporter"], r["opset"], r["runtime"])] = r
    return out


def opset_broken(store: Path, base_run: str, cand_run: str) -> set[tuple]:
    """Cells both sides pass whose candidate file declares another opset than the cell asked for
    where the baseline's kept it (the requested opset is a promise), read from results.jsonl."""
    def kept(r: dict) -> bool:
        return r.get("opset_actual") in (None, r["opset"])

    base, cand = _raw(store, base_run), _raw(store, cand_run)
    return {k for k, b in base.items() if k in cand and b["status"] == cand[k]["status"] == "pass"
            and kept(b) and not kept(cand[k])}


def test_backwards_bump_flags_exactly_the_cells_it_breaks(first, store) -> None:
    base_run, = first.data["baseline"]["runs"]
    cand_run, = first.data["candidate"]["runs"]
    # The store was empty: the gate ran both versions itself and kept them for later gates.
    assert first.data["baseline"]["executed"] == [base_run]
    assert first.data["candidate"]["executed"] == [cand_run]
    assert (store / "runs" / base_run / "fingerprint.json").exists()
    base, cand = raw_results(store, base_run), raw_results(store, cand_run)
    broken = {k for k in base if base[k] == "pass" and cand.get(k) in FAILED}
    assert broken, "torch 2.6.0 should fail cells that 2.13.0 passes"
    expected = broken | opset_broken(store, base_run, cand_run)
    assert first.keys(Verdict.NEW_FAILURE) == expected
    assert first.rc == 1
    junit = ET.parse(first.out / "junit.xml").getroot()
    assert int(junit.get("tests")) == len(base) == 6
    failed = {(tc.get("classname").removeprefix("gate."), tc.get("name")) for tc in junit
              if tc.find("failure") is not None}
    assert {(k[0], f"{k[1]}-op{k[2]}-{k[3]}") for k in expected} <= failed
    md = (first.out / "gate.md").read_text()
    assert md.startswith("## Upgrade gate: torch 2.13.0 → 2.6.0: ❌") and "### New failures" in md


def test_forward_bump_reports_fixes_and_passes(first, store, tmp_path) -> None:
    result = gate(store, tmp_path / "g", "--baseline", "2.6.0", "--candidate", "2.13.0", *NO_LATENCY)
    base_run, = first.data["baseline"]["runs"]
    cand_run, = first.data["candidate"]["runs"]
    # A status that recovers is fixed; a file that keeps its opset again gets a note, not a verdict.
    promise = opset_broken(store, base_run, cand_run)
    assert result.keys(Verdict.FIXED) == first.keys(Verdict.NEW_FAILURE) - promise
    notes = {(c["case"], c["exporter"], c["opset"], c["runtime"]): c for c in result.data["cells"]}
    assert not any(notes[k]["blocking"] for k in promise)
    assert result.rc == 0 and "✅ no regression" in result.stdout
    # Every cell came from the store: nothing was run again.
    assert result.data["baseline"]["executed"] == result.data["candidate"]["executed"] == []


def test_same_torch_twice_never_flags_latency(first, store, tmp_path) -> None:
    run_b = tmp_path / "run-b"
    run_harness("--reports", str(store), "matrix", "--config", str(GATE), "--only", "torch=2.13.0",
                "--output", str(run_b))
    run_a, = first.data["baseline"]["runs"]
    result = gate(store, tmp_path / "g", "--baseline", run_a, "--candidate", str(run_b))
    verdicts = {c["verdict"] for c in result.data["cells"]}
    assert Verdict.SLOWER.value not in verdicts and Verdict.NEW_FAILURE.value not in verdicts
    assert result.rc == 0
    assert result.data["counts"]["unchanged"] + result.data["counts"]["faster"] == 6


def test_known_failures_never_block_and_stale_entries_show_as_xpass(first, store, tmp_path) -> None:
    result = gate(store, tmp_path / "g", "--baseline", "2.13.0", "--candidate", "2.6.0",
                  *NO_LATENCY, config=GATE_XFAIL)
    assert result.rc == 0
    assert result.keys(Verdict.XFAIL) == first.keys(Verdict.NEW_FAILURE)
    assert result.keys(Verdict.XPASS) == {("mha", "dynamo", 18, "ort-cpu")}
    assert "remove their `xfail` entries" in (result.out / "gate.md").read_text()


@pytest.mark.parametrize("args", [
    ["--baseline", "2.13.0"],                                        # no candidate
    ["--baseline", "2.13.0", "--candidate", "no-such-run"],          # neither version nor run
    ["--baseline", "2.13.0", "--candidate", "2.6.0", "--config", "missing.yaml"],
    ["--baseline", "2.13.0", "--candidate", "2.6.0", "--latency-threshold", "0.5"],
])
def test_bad_arguments_exit_2(args, tmp_path) -> None:
    proc = run_harness("--reports", str(tmp_path), "gate", *args, check=False)
    assert proc.returncode == 2, proc.stderr


def test_run_without_that_torch_version_exits_2(first, store, tmp_path) -> None:
    run_a, = first.data["baseline"]["runs"]
    proc = run_harness("--reports", str(store), "gate", "--config", str(GATE), "--baseline",
                       f"{run_a}@9.9.9", "--candidate", "2.6.0", check=False)
    assert proc.returncode == 2 and "has no torch 9.9.9" in proc.stderr


def _rec(torch: str, status: str = "pass", max_abs: float = 1e-7, samples: list | None = None) -> Record:
    return Record(run_id=f"r{torch}", case="c", torch=torch, exporter="dynamo", opset=18,
                  runtime="ort-cpu", status=status, parity={"max_abs": max_abs, "atol": 1e-4},
                  latency_ms={"samples": samples or [1.0, 1.1, 0.9], "threads": 1})


def test_parity_drift_beyond_the_case_budget_is_a_regression() -> None:
    key = CellKey("c", "dynamo", 18, "ort-cpu")
    drift = compare_cell(key, _rec("a"), _rec("b", max_abs=8e-5), Settings(), True)
    assert drift.verdict is Verdict.PARITY_DRIFT and drift.verdict.blocking
    small = compare_cell(key, _rec("a"), _rec("b", max_abs=3e-5), Settings(), True)
    assert small.verdict is Verdict.UNCHANGED
    changed = compare_cell(key, _rec("a"), _rec("b"), Settings(), False)
    assert changed.verdict is Verdict.NOT_COMPARABLE and not changed.verdict.blocking


def test_a_red_cell_that_now_fails_at_an_earlier_stage_blocks() -> None:
    """Failing before and after is "still failing", unless the candidate no longer gets as far:
    a cell that exported and failed at run, now failing at export, is a regression."""
    from harness.core.cell import CellKey
    from harness.core.record import Record
    from harness.core.status import Status
    from harness.gate.compare import Settings, compare_cell

    key = CellKey("mha", "torchscript", 17, "ort-cpu")
    rec = lambda stage, status=Status.FAIL: Record.for_cell(
        "r", key, "2.13.0", "e", status, stage=stage, error=f"Boom at {stage}")
    earlier = compare_cell(key, rec("run"), rec("export"), Settings(), None)
    assert earlier.verdict is Verdict.FAILS_EARLIER and earlier.verdict.blocking
    assert earlier.detail.startswith("fails earlier: run → export") and earlier.verdict.mark == "!"
    later = compare_cell(key, rec("export"), rec("parity"), Settings(), None)
    assert later.verdict is Verdict.STILL_FAILING and not later.verdict.blocking
    crash = compare_cell(key, rec("parity"), rec("load", Status.CRASH), Settings(), None)
    assert crash.verdict is Verdict.FAILS_EARLIER
    same = compare_cell(key, rec("run"), rec("run"), Settings(), None)
    assert same.verdict is Verdict.STILL_FAILING
