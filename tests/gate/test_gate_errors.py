"""The gate's exit code can be trusted: 1 only for a regression. Bad arguments, identical sides,
a torch the index does not have, an environment that could not be built, and any unexpected
error are 2, with one line on stderr; environment failures are never reused from the store."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import BOTH, TESTS

from harness.cli import main
from harness.core.record import read_records
from harness.envs.provider import EnvironmentBuildError

GATE = TESTS / "matrices" / "gate.yaml"


@pytest.fixture
def gate(tmp_path, monkeypatch, capsys):
    """Run `python -m harness gate` in-process against a store; returns (exit code, stderr lines)."""
    monkeypatch.setenv("HARNESS_ENVS_DIR", str(tmp_path / "envs"))

    def run(store: Path, *args: str, config: Path = GATE) -> tuple[int, list[str]]:
        rc = main(["--reports", str(store), "gate", "--config", str(config), "--remeasure", "0", *args])
        return rc, capsys.readouterr().err.strip().splitlines()

    return run


def runs_in(store: Path) -> set[str]:
    return {p.name for p in (store / "runs").iterdir()} if (store / "runs").exists() else set()


@pytest.mark.parametrize("args, says", [
    (["--baseline", "2.13.0", "--candidate", "2.13.0"], "are the same results"),
    (["--baseline", "2.13", "--candidate", "2.13.0"], "are the same results"),
    (["--baseline", f"{BOTH}@2.13.0", "--candidate", f"{BOTH}@2.13.0"], "are the same results"),
    (["--baseline", "2.13.0", "--candidate", "no-such-run"], "neither a torch version"),
    (["--baseline", f"{BOTH}@9.9.9", "--candidate", "2.6.0"], "has no torch 9.9.9"),
    (["--baseline", "2.13.0", "--candidate", "2.6.0", "--alpha", "2"], "--alpha"),
])
def test_bad_arguments_are_one_line_and_exit_2(gate, store, args, says):
    before = runs_in(store)
    rc, err = gate(store, *args)
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert runs_in(store) == before   # nothing ran


def test_same_run_by_id_and_by_directory_is_refused(gate, store):
    rc, err = gate(store, "--baseline", f"{BOTH}@2.6.0", "--candidate", f"{store / 'runs' / BOTH}@2.6.0")
    assert rc == 2 and "are the same results" in err[0]


def test_output_that_is_a_file_exits_2(gate, store, tmp_path):
    target = tmp_path / "file"
    target.write_text("")
    rc, err = gate(store, "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{BOTH}@2.6.0", "--output", str(target))
    assert rc == 2 and err == [f"error: --output {target}: is a file; expected a directory"]


@pytest.mark.parametrize("which", ["baseline", "candidate"])
def test_torch_the_index_lacks_exits_2_before_anything_runs(gate, tmp_path, which):
    """9.9.9 is resolved with uv (both sides, before any cell runs): never "2 fixed" or
    "2 regressions" from a side of environment failures."""
    store = tmp_path / "reports"
    versions = {"baseline": "2.13.0", "candidate": "2.13.0", which: "9.9.9"}
    if which == "baseline":
        versions["candidate"] = "2.6.0"
    rc, err = gate(store, "--baseline", versions["baseline"], "--candidate", versions["candidate"])
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --{which} 9.9.9: ") and "torch==9.9.9" in err[0]
    assert not runs_in(store) and not (tmp_path / "envs").exists()


@pytest.fixture
def broken_envs(monkeypatch):
    """Every environment build fails (a network hiccup); resolution succeeds. Counts builds."""
    from harness.envs import resolve
    from harness.envs.venv import VenvProvider

    calls = []

    def ensure(self, spec):
        calls.append(spec.name)
        raise EnvironmentBuildError(f"environment {spec.name}: uv pip install failed:\nConnection reset by peer")

    monkeypatch.setattr(VenvProvider, "ensure", ensure)
    monkeypatch.setattr(resolve, "resolve_spec", lambda spec: None)
    monkeypatch.setattr(resolve, "python_unavailable", lambda version: None)
    return calls


def test_environment_failure_exits_2_and_is_never_reused(gate, tmp_path, broken_envs):
    from harness.gate.sources import is_environment_failure

    store = tmp_path / "reports"
    rc, err = gate(store, "--baseline", "2.13.0", "--candidate", "2.6.0")
    errors = [line for line in err if line.startswith("error:")]   # the rest is the runs' progress
    assert rc == 2 and len(errors) == 1 and errors[0] == err[-1], err
    assert errors[0].startswith("error: --baseline 2.13.0: environment torch2.13.0-cpu-")
    assert "; --candidate 2.6.0: environment torch2.6.0-cpu-" in errors[0]   # both sides named
    assert "could not be built" in errors[0] and "EnvironmentBuildError" in errors[0]
    first_builds = len(broken_envs)
    assert first_builds == 2   # both sides were attempted before the verdict
    stored = [r for run in runs_in(store) for r in read_records(store / "runs" / run / "results.jsonl")]
    assert stored and all(is_environment_failure(r) for r in stored)
    # A later gate does not take those records from the store: it builds (and fails) again.
    rc, err = gate(store, "--baseline", "2.13.0", "--candidate", "2.6.0")
    assert rc == 2 and len(broken_envs) == first_builds + 2
    # A stored run of environment failures given by id is refused the same way.
    failed_run = next(run for run in runs_in(store)
                      if read_records(store / "runs" / run / "results.jsonl")[0].torch == "2.6.0")
    rc, err = gate(store, "--baseline", "2.13.0", "--candidate", failed_run)
    assert rc == 2 and f"--candidate {failed_run}: environment torch2.6.0-cpu-" in err[-1]


def test_environment_failure_records_are_recognised():
    from harness.core.cell import CellKey
    from harness.core.record import Record
    from harness.core.status import Status
    from harness.gate.sources import is_environment_failure
    from harness.matrix.config import Matrix
    from harness.matrix.plan import build_plan
    from harness.run.runner_records import environment_failure_records

    plan = build_plan(Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18],
                                             "cases": ["mha"]}))
    env = plan.environments[0]
    recs = environment_failure_records("r", env, env.cells, EnvironmentBuildError("no network"))
    assert recs and all(is_environment_failure(r) for r in recs)
    crash = Record.for_cell("r", CellKey("mha", "dynamo", 18, "ort-cpu"), "2.13.0", "e", Status.CRASH,
                            error="Crash: worker killed by signal SIGSEGV")
    assert not is_environment_failure(crash)


def test_unexpected_error_is_one_line_exit_2_with_the_traceback_in_a_file(gate, store, monkeypatch):
    from harness.gate import driver as gate_driver

    def boom(*a, **k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(gate_driver, "compare_sides", boom)
    rc, err = gate(store, "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{BOTH}@2.6.0")
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: unexpected RuntimeError in 'gate': boom (traceback: ")
    path = Path(err[0].rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert path.is_file() and "RuntimeError: boom" in path.read_text()


def test_sys_exit_inside_the_gate_is_never_read_as_a_regression(gate, store, monkeypatch):
    from harness.gate import driver as gate_driver

    monkeypatch.setattr(gate_driver, "compare_sides", lambda *a, **k: (_ for _ in ()).throw(SystemExit(1)))
    rc, err = gate(store, "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{BOTH}@2.6.0")
    assert rc == 2 and len(err) == 1


def test_unexpected_error_in_other_commands_is_exit_3(store, monkeypatch, capsys):
    import harness.report as report

    monkeypatch.setattr(report, "render_run", lambda *a, **k: (_ for _ in ()).throw(KeyError("x")))
    rc = main(["--reports", str(store), "report", BOTH])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and len(err) == 1 and err[0].startswith("error: unexpected KeyError in 'report'")


def test_gate_json_records_the_exit_code_of_a_regression(gate, store, tmp_path):
    """The stored-runs gate still exits 1 for its regressions (no change for real verdicts)."""
    out = tmp_path / "g"
    rc, _ = gate(store, "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{BOTH}@2.6.0", "--output", str(out))
    assert rc == 1 and json.loads((out / "gate.json").read_text())["exit_code"] == 1


@pytest.mark.parametrize("finished, at", [(True, ""), (False, ""), (True, "@2.13.0")])
def test_a_run_without_records_as_a_side_says_so(gate, store, finished, at):
    from harness.core.run import RunMeta

    empty = store / "runs" / "20261130-120000-0e0e0e"
    empty.mkdir()
    RunMeta(run_id=empty.name, started=1.0, finished=finished, matrix_hash="0e0e0e").write(empty)
    if finished:
        (empty / "results.jsonl").write_text("")
    state = "" if finished else ", and is not finished"
    for args in (["--baseline", f"{empty.name}{at}", "--candidate", f"{BOTH}@2.13.0"],
                 ["--baseline", f"{BOTH}@2.6.0", "--candidate", f"{empty}{at}"]):
        rc, err = gate(store, *args)
        assert rc == 2 and len(err) == 1, err
        assert err[0] == (f"error: run {empty.name} ({empty}) has no records{state}: nothing to compare; "
                          "expected a run that holds results")


@pytest.mark.parametrize("where", ["env", "envs-root"])
def test_an_environment_that_cannot_be_created_is_the_documented_line(gate, store, tmp_path, monkeypatch, where):
    """A file where the candidate's environment folder (or the environments folder) goes: the
    gate's "could not be built" line, exit 2; the store holds no empty unfinished run."""
    from harness.gate.sources import is_environment_failure, version_plan
    from harness.matrix.config import load_matrix
    from harness.store.runs import read_run_meta

    _, plan = version_plan(load_matrix(GATE), "2.13.0")
    name = plan.environments[0].env.name
    envs = tmp_path / "envs"
    if where == "env":
        envs.mkdir()
        (envs / name).write_text("a file, not an environment")
        blocked = envs / name
    else:
        envs.write_text("a file, not a folder")
        blocked = envs
    before = runs_in(store)
    rc, err = gate(store, "--baseline", f"{BOTH}@2.6.0", "--candidate", "2.13.0")
    assert rc == 2 and err[-1].startswith(f"error: --candidate 2.13.0: environment {name} could not be built"), err
    assert f"cannot be created at {blocked}" in err[-1], err[-1]
    assert ("Not a directory" if where == "env" else "File exists") in err[-1], err[-1]
    new = runs_in(store) - before
    for run in new:
        assert read_run_meta(store / "runs" / run).finished
        recs = read_records(store / "runs" / run / "results.jsonl")
        assert recs and all(is_environment_failure(r) for r in recs)
