"""Shared fixtures: one real end-to-end run per test session, reused by every test that reads it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def run_harness(*args: str, cwd: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True,
                          text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"harness {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_matrix(tmp_path_factory, name: str, config: str, *args: str) -> Path:
    """Run tests/matrices/<config> into a fresh temporary run directory; return that directory."""
    out = tmp_path_factory.mktemp(name) / "run"
    run_harness("matrix", "--config", str(TESTS / "matrices" / config), "--output", str(out), *args)
    return out


@pytest.fixture(scope="session")
def e2e_run(tmp_path_factory) -> Path:
    """The e2e matrix (tests/matrices/e2e.yaml) run once for the whole session.

    HARNESS_E2E_RUN_DIR points at an existing finished run of that matrix to skip re-running it
    while developing; CI never sets it.
    """
    reuse = os.environ.get("HARNESS_E2E_RUN_DIR")
    if reuse and (Path(reuse) / "run.json").exists():
        return Path(reuse)
    return run_matrix(tmp_path_factory, "e2e", "e2e.yaml")


@pytest.fixture(scope="session")
def e2e_records(e2e_run):
    from harness.records import read_records

    return read_records(e2e_run / "results.jsonl")


@pytest.fixture(scope="session")
def e2e_meta(e2e_run):
    return json.loads((e2e_run / "run.json").read_text())


def env_python(meta: dict, torch_version: str, family: str = "cpu") -> Path:
    from harness.envs import envs_dir

    for name in meta["environments"]:
        if name.startswith(f"torch{torch_version}-{family}"):
            return envs_dir() / name / "bin" / "python"
    raise KeyError(f"no {family} environment for torch {torch_version} in run")
