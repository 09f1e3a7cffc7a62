"""The nox sessions end with the harness's own exit code (2 bad input), not nox's generic 1:
a CI step running `nox -s plan` / `matrix` / `report` / `gate` can tell bad input from a finding.
Real nox, run with --no-venv so that the session's `python` is the product environment's
(tests/helpers.py `product_python`: the declared dependencies only)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, TESTS, product_env

DUPLICATE = "torch: ['2.13.0']\nexporters: [torchscript]\nopsets: [17]\ncases: [conv_bn]\nopsets: [18]\n"


def _nox() -> str | None:
    """The nox script itself (a pyenv shim would put its own Python first on PATH)."""
    found = shutil.which("nox")
    if found and "shims" in Path(found).parts:
        proc = subprocess.run(["pyenv", "which", "nox"], capture_output=True, text=True)
        found = proc.stdout.strip() if proc.returncode == 0 else None
    return found


NOX = _nox()
pytestmark = pytest.mark.skipif(NOX is None, reason="nox is not installed")


def nox(tmp_path: Path, session: str, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = product_env(HARNESS_ENVS_DIR=str(tmp_path / "envs"), **extra)
    return subprocess.run([NOX, "-f", str(ROOT / "noxfile.py"), "--no-venv", "-s", session, "--", *args],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("session", ["plan", "matrix", "gate"])
def test_bad_input_ends_the_session_with_exit_2(tmp_path, session):
    config = tmp_path / "matrix.yaml"
    config.write_text(DUPLICATE)
    args = ["--config", str(config)] + (["--baseline", "2.6.0", "--candidate", "2.13.0"] if session == "gate" else [])
    proc = nox(tmp_path, session, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "key 'opsets': given twice" in proc.stdout + proc.stderr
    assert not (tmp_path / "envs").exists()


def test_report_of_a_run_that_is_not_there_is_exit_2(tmp_path):
    proc = nox(tmp_path, "report", "--reports", str(tmp_path / "reports"), "no-such-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no-such-run" in proc.stdout + proc.stderr


def test_a_good_plan_is_exit_0(tmp_path):
    proc = nox(tmp_path, "plan", "--config", str(TESTS / "matrices" / "e2e.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cells in" in proc.stdout


# Kills the harness process (python -m harness ...) by a signal at start-up, and nothing else.
KILLER = """import os, sys
if os.environ.get("KILL_HARNESS") and sys.orig_argv[1:3] == ["-m", "harness"]:
    os.kill(os.getpid(), int(os.environ["KILL_HARNESS"]))
"""


@pytest.mark.parametrize("session, expected", [("matrix", 128 + 9), ("plan", 128 + 9), ("gate", 2)])
def test_a_harness_killed_by_a_signal_ends_the_session_with_128_plus_n(tmp_path, session, expected):
    """As docs/robustness.md promises (the gate: 2, never a verdict); it used to be 2 for every session."""
    (tmp_path / "sitecustomize.py").write_text(KILLER)
    args = ["--baseline", "2.6.0", "--candidate", "2.13.0"] if session == "gate" else []
    proc = nox(tmp_path, session, "--config", str(TESTS / "matrices" / "e2e.yaml"), *args,
               PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", KILL_HARNESS="9")
    assert proc.returncode == expected, proc.stdout + proc.stderr
