"""Helpers shared by the tests (importable as ``helpers``: pyproject puts tests/ on the path)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
# Fixture runs (tests/fixtures/runs/): schema 0 on torch 2.6.0, 2.6.0 + 2.13.0, a hostile copy.
OLD, BOTH, HOSTILE = "20261129-143928-ca9e5d", "20261129-144014-ca9e5d", "20261129-150000-0bad00"


def run_harness(*args: str, cwd: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True,
                          text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"harness {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_matrix(tmp_path_factory, name: str, config: str, *args: str) -> Path:
    """Run tests/matrices/<config> into a fresh temporary run directory; return that directory.

    A cell the matrix's own code failed on (status ``error``) fails every test that runs a test
    matrix: it is a bug of the project, never a verdict (the default matrix's nightly fails on
    one through ``history check``)."""
    out = tmp_path_factory.mktemp(name) / "run"
    run_harness("matrix", "--config", str(TESTS / "matrices" / config), "--output", str(out), *args)
    assert_no_own_errors(out)
    return out


def assert_no_own_errors(run_dir: Path) -> None:
    import json

    own = [(r["cell_id"], r.get("error")) for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())
           if r.get("status") == "error"]
    assert not own, f"the matrix's own code failed on {len(own)} cells of {run_dir}: {own[:5]}"


def env_python(meta, torch_version: str, family: str = "cpu") -> Path:
    from harness.core.paths import envs_dir

    environments = meta.environments if hasattr(meta, "environments") else meta["environments"]
    for name in environments:
        if name.startswith(f"torch{torch_version}-{family}"):
            return envs_dir() / name / "bin" / "python"
    raise KeyError(f"no {family} environment for torch {torch_version} in run")


def make_store(root: Path) -> Path:
    """A results store holding copies of the fixture runs, indexed like finished runs."""
    from harness.store.runs import list_runs, update_index

    reports = root / "reports"
    shutil.copytree(FIXTURES / "runs", reports / "runs")
    for run in list_runs(reports):
        update_index(run, reports)
    return reports


def check_reference(name: str, text: str) -> None:
    path = FIXTURES / "expected" / name
    if os.environ.get("HARNESS_UPDATE_REFERENCE"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with HARNESS_UPDATE_REFERENCE=1 to create it"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its reference"
