"""Shared fixtures: one real end-to-end run per test session, reused by every test that reads it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import make_store, run_matrix


@pytest.fixture
def store(tmp_path) -> Path:
    """A results store holding copies of the fixture runs."""
    return make_store(tmp_path)


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
    from harness.core.record import read_records

    return read_records(e2e_run / "results.jsonl")


@pytest.fixture(scope="session")
def e2e_meta(e2e_run):
    from harness.store.runs import read_run_meta

    return read_run_meta(e2e_run)
