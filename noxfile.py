"""Front door: thin sessions that read matrix.yaml; the work lives in harness/."""
from __future__ import annotations

from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"


LOCAL_WHEELS = Path("/opt/wheels")  # torch CPU wheels on this disk, used before downloading


def _install(session: nox.Session, *extras: str) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session(python="3.11")
def matrix(session: nox.Session) -> None:
    """Run the compatibility matrix (args: --config PATH --output DIR --only AXIS=V,... --resume)."""
    _install(session)
    session.run("python", "-m", "harness", "matrix", *session.posargs)


@nox.session(python="3.11")
def plan(session: nox.Session) -> None:
    """Print the environments and cells a matrix file expands to, without running them."""
    _install(session)
    session.run("python", "-m", "harness", "plan", *session.posargs)


@nox.session(python="3.11")
def report(session: nox.Session) -> None:
    """Re-render reports from stored results (args: RUN ... ; default: latest)."""
    _install(session)
    session.run("python", "-m", "harness", "report", *session.posargs)


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Run the test suite (unit tests and real end-to-end matrices)."""
    _install(session, "test")
    # Worker-side modules (parity, runners) are also unit-tested in-process: they need torch.
    links = ["--find-links", str(LOCAL_WHEELS)] if LOCAL_WHEELS.exists() else []
    session.install("torch==2.13.0", "onnx==1.23.2", "onnxruntime==1.32.0", *links)
    session.run("pytest", *(session.posargs or ["-q", "-ra"]))
