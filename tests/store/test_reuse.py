"""The reuse policies (harness.store.reuse): one scan of finished runs, each policy's own rule.

Every test builds a small store of real run directories (run.json + results.jsonl as the runner
writes them) and asks each policy which stored record may stand for a new cell.
"""
from __future__ import annotations

import pytest

from harness.core.cell import CellKey
from harness.core.files import file_digest
from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.store.reuse import (
    ADVISE,
    BISECT,
    CACHE,
    GATE,
    HISTORY,
    POLICIES,
    Wanted,
    finished_runs,
    reuse,
)

KEY = CellKey("conv_bn", "dynamo", 18, "ort-cpu")
CELL = KEY.cell_id("2.13.0")
PRINT = {"harness": "0.1.0", "code": "x", "cases": {"conv_bn": "abc"}}
CACHE_KEY = "0" * 32


def _run(reports, run_id, started, records, finished=True, fingerprint=PRINT):
    run_dir = reports / "runs" / run_id
    run_dir.mkdir(parents=True)
    RunMeta(run_id=run_id, started=started, finished=finished, fingerprint=fingerprint).write(run_dir)
    for rec in records:
        append_record(run_dir / "results.jsonl", rec)
    return run_dir


def _rec(run_id, status=Status.PASS, **kw):
    kw.setdefault("cache_key", CACHE_KEY)
    return Record.for_cell(run_id, KEY, "2.13.0", kw.pop("env", "env-a"), status, **kw)


def _wanted(base_dir, **kw):
    return Wanted(fingerprint=PRINT, base_dir=base_dir, keys={CELL: CACHE_KEY}, envs={CELL: "env-a"}, **kw)


def _taken(policy, reports, wanted):
    found = reuse(policy, reports, wanted, [CELL])
    return found.records[CELL].run_id if CELL in found.records else found.refused.get(CELL)


@pytest.fixture
def case_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("WEIGHTS = 1\n")
    return path


def test_a_stored_cell_whose_case_file_changed_is_refused_by_every_policy_but_history(tmp_path, case_file):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", case_files={str(case_file): file_digest(case_file)})])
    wanted = _wanted(tmp_path)
    assert {name: _taken(p, reports, wanted) for name, p in POLICIES.items()} == {n: "r1" for n in POLICIES}
    case_file.write_text("WEIGHTS = 2\n")
    after = {name: _taken(p, reports, wanted) for name, p in POLICIES.items()}
    assert after.pop("history") == "r1"      # what happened stays in the history
    assert all(why.startswith("files its case loaded changed since") and "model.py" in why
               for why in after.values()), after


def test_an_unfinished_run_is_refused_by_every_policy(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1")], finished=False)
    assert [r.meta.run_id for r in finished_runs(reports)] == []
    for policy in POLICIES.values():
        assert CELL not in reuse(policy, reports, _wanted(tmp_path), [CELL]).records


def test_the_gate_takes_an_older_run_over_an_unfinished_newer_one(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", Status.FAIL, stage="export")])
    _run(reports, "r2", 2.0, [_rec("r2")], finished=False)
    assert _taken(GATE, reports, _wanted(tmp_path)) == "r1"


def test_the_cache_refuses_a_crash_the_gate_compares_it(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", Status.CRASH, error="WorkerDied: killed")])
    wanted = _wanted(tmp_path)
    assert "says nothing lasting" in _taken(CACHE, reports, wanted)
    assert _taken(GATE, reports, wanted) == "r1" and _taken(BISECT, reports, wanted) == "r1"


def test_an_environment_failure_is_refused_by_every_policy(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", Status.CRASH, error="EnvironmentBuildError: uv failed")])
    for name, policy in POLICIES.items():
        assert _taken(policy, reports, _wanted(tmp_path)) == "its environment could not be built", name


def test_the_cache_wants_the_new_cells_key_the_gate_does_not(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", cache_key="1" * 32)])
    wanted = _wanted(tmp_path)
    assert _taken(CACHE, reports, wanted) == "its cache key is not the new cell's"
    assert _taken(GATE, reports, wanted) == "r1"


def test_the_gate_wants_the_same_code_the_cache_and_advisor_do_not_ask(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1")], fingerprint={**PRINT, "harness": "0.0.9"})
    _run(reports, "r0", 0.5, [_rec("r0")], fingerprint=None)
    wanted = _wanted(tmp_path)
    assert _taken(GATE, reports, wanted) == "produced by another harness version or case source"
    assert _taken(BISECT, reports, wanted) == "produced by another harness version or case source"
    # The cache's key covers the code itself; the advisor reads what was measured.
    assert _taken(CACHE, reports, wanted) == "r1" and _taken(ADVISE, reports, wanted) == "r1"


def test_gate_and_bisect_want_the_planned_environment_and_fall_back_to_an_older_run_that_has_it(tmp_path):
    # A package gate moves one companion pin: a cell of another environment is another cell.
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", env="env-a")])
    _run(reports, "r2", 2.0, [_rec("r2", env="env-b")])      # a companion pin changed since
    wanted = _wanted(tmp_path)
    assert _taken(GATE, reports, wanted) == "r1"
    assert _taken(BISECT, reports, wanted) == "r1"
    assert _taken(ADVISE, reports, wanted) == "r2"           # the advisor reads what was measured
    why = _taken(BISECT, reports, Wanted(PRINT, tmp_path, envs={CELL: "env-c"}))
    assert why.startswith("ran in another environment than the one planned now") and "env-b" in why


def test_newest_accepted_record_wins_and_a_damaged_run_is_skipped(tmp_path):
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1")])
    _run(reports, "r2", 2.0, [_rec("r2", Status.FAIL, stage="run")])
    bad = _run(reports, "r3", 3.0, [])
    (bad / "results.jsonl").write_text("[1, 2]\n")
    seen = []
    found = reuse(HISTORY, reports, _wanted(tmp_path), [CELL], damaged=lambda d, exc: seen.append(d.name))
    assert found.records[CELL].run_id == "r2" and seen == ["r3"]


def test_every_refusal_is_listed_with_its_reason_and_fix(tmp_path, case_file):
    """Not only the newest refused record per cell: every record and every run a policy could
    not use, each with why and what to do; `explain` groups them for a command that found
    nothing usable."""
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1")], fingerprint=None)                       # predates fingerprints
    _run(reports, "r2", 2.0, [_rec("r2", case_files={"model.py": "0" * 16})])      # the file changed since
    _run(reports, "r3", 3.0, [_rec("r3", env="env-z")])                            # another environment
    bad = _run(reports, "r4", 4.0, [])
    (bad / "results.jsonl").write_text("[1, 2]\n")
    found = reuse(GATE, reports, _wanted(tmp_path), [CELL], damaged=lambda d, exc: None)
    assert not found.records and found.scanned == 4
    by_run = {r.run: r for r in found.refusals}
    assert set(by_run) == {"r1", "r2", "r3", "r4"}
    assert by_run["r1"].cell is None and "no fingerprint" in by_run["r1"].reason
    assert by_run["r2"].cell == CELL and by_run["r2"].reason == "files its case loaded changed since: model.py"
    assert by_run["r3"].reason.startswith("ran in another environment") and by_run["r4"].reason.startswith("the run cannot be read")
    assert by_run["r2"].to_dict()["fix"].startswith("a file the case loaded was edited since")
    lines = found.explain()
    assert len(lines) == 4 and any(line.startswith("1 record(s) of 1 run(s) refused: files its case loaded changed since (r2); "
                                                   "fix: a file the case loaded was edited since") for line in lines), lines
    assert found.explain(case="other_case") == [line for line in lines if line.startswith("1 run(s)")]


def test_a_command_that_finds_nothing_usable_names_what_it_found_why_and_the_fix(tmp_path, case_file, monkeypatch, capsys):
    """advise: every stored record of the case was refused (a file it loaded changed since)."""
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    reports = tmp_path / "reports"
    _run(reports, "r1", 1.0, [_rec("r1", case_files={"model.py": "0" * 16})])
    rc = main(["--reports", str(reports), "advise", "--case", "conv_bn"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "no case 'conv_bn' in 1 finished run(s)" in err
    assert ("found 1 finished run(s) in " in err and "1 record(s) of 1 run(s) refused: files its case loaded "
            "changed since (r1); fix: a file the case loaded was edited since") in err, err
    rc = main(["--reports", str(reports), "advise", "--case", "other"])
    assert rc == 2 and "none holding case 'other'" in " ".join(capsys.readouterr().err.split())
