"""Shared fixtures: one real end-to-end run per test session, reused by every test that reads it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import CURRENT_TEST, make_store, run_matrix

# The shared end-to-end run: a test that reads it runs cells, whatever its module says.
E2E_FIXTURES = {"e2e_run", "e2e_records", "e2e_meta"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Before `-m` selects: every test that uses the shared end-to-end run is e2e."""
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures: is it marked e2e (``helpers.check_e2e_marker``)."""
    CURRENT_TEST.update(e2e=item.get_closest_marker("e2e") is not None, id=item.nodeid)


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
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_matrix(tmp_path_factory, "e2e", "e2e.yaml")
    # Under xdist each worker has its own session: the first to ask runs the matrix, the others
    # wait on the lock and read the same finished run (its tests only read it).
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent
    with FileLock(str(shared / "e2e-run.lock")):
        marker = shared / "e2e-run.path"
        if marker.exists():
            return Path(marker.read_text())
        out = run_matrix(tmp_path_factory, "e2e", "e2e.yaml")
        marker.write_text(str(out))
        return out


@pytest.fixture(scope="session")
def e2e_records(e2e_run):
    from harness.core.record import read_records

    return read_records(e2e_run / "results.jsonl")


@pytest.fixture(scope="session")
def e2e_meta(e2e_run):
    from harness.store.runs import read_run_meta

    return read_run_meta(e2e_run)
