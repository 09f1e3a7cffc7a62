"""Front door: thin sessions that read matrix.yaml; the work lives in harness/."""
from __future__ import annotations

import hashlib
from pathlib import Path

import nox
import nox.command

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"


LOCAL_WHEELS = Path("/opt/wheels")  # torch CPU wheels on this disk, used before downloading


def _install(session: nox.Session, *extras: str, also: tuple[str, ...] = ()) -> None:
    """Editable install of the project, skipped while pyproject.toml and the request are unchanged
    (a warm re-run installs nothing; code changes need no reinstall in editable mode)."""
    location = getattr(session.virtualenv, "location", None)
    if location is None:
        return   # --no-venv: the interpreter nox runs in has the project already
    spec = f".[{','.join(extras)}]" if extras else "."
    request = (spec, also, "bytecode")
    stamp_text = hashlib.sha256(Path("pyproject.toml").read_bytes() + repr(request).encode()).hexdigest()
    stamp = Path(location) / ".harness-install-stamp"
    if stamp.exists() and stamp.read_text() == stamp_text:
        return
    session.install("-e", spec)
    if also:
        session.install(*also)
    _compile(session, Path(location))
    stamp.write_text(stamp_text)


def _compile(session: nox.Session, location: Path) -> None:
    """Compile the session's packages and the harness to bytecode, once per install (pip does it
    for what it installs, uv does not). The runner, the workers and every test's subprocess import
    pandas, scipy, pydantic and the harness; where PYTHONDONTWRITEBYTECODE is set (CI, containers)
    they would compile those sources again at every start. Exit 1 (a file that does not compile
    under this Python, such as a test module written for a newer one) leaves that file alone."""
    sites = [str(p) for p in location.glob("lib/python*/site-packages")]
    session.run("python", "-m", "compileall", "-q", "-j", "0", *sites, "harness", success_codes=[0, 1],
                silent=True)


def _invoked(session: nox.Session) -> dict[str, str]:
    """Tell the harness where the user ran nox, so relative paths in arguments mean what they say."""
    return {"HARNESS_INVOKED_FROM": str(session.invoked_from)}


def _harness(session: nox.Session, command: str, codes: tuple[int, ...] | None = None,
             otherwise: int = 2) -> None:
    """The whole body of a thin session: install the project, run one harness command, and end
    with the harness's own exit code (2 bad input, 3 unexpected error, 128 + N a signal; see
    harness/cli.py) instead of nox's generic 1. ``codes``: the only codes passed on as they are,
    any other (and a failed install) ends as ``otherwise`` (the gate: 0, 1 or 2, nothing else)."""
    try:
        _install(session)
    except nox.command.CommandFailed:
        if codes is None:
            raise
        raise SystemExit(otherwise) from None
    try:
        session.run("python", "-m", "harness", command, *session.posargs, env=_invoked(session),
                    success_codes=[0])
    except nox.command.CommandFailed as exc:
        code = exc.return_code
        if isinstance(code, int) and code < 0:
            code = 128 - code      # killed by signal N (-N from the process): the shell's 128 + N
        if not isinstance(code, int) or code <= 0 or (codes is not None and code not in codes):
            code = otherwise
        raise SystemExit(code) from None


@nox.session(python="3.11")
def matrix(session: nox.Session) -> None:
    """Run the compatibility matrix (args: --config PATH --output DIR --only AXIS=V,... --resume)."""
    _harness(session, "matrix")


@nox.session(python="3.11")
def plan(session: nox.Session) -> None:
    """Print the environments and cells a matrix file expands to, without running them."""
    _harness(session, "plan")


@nox.session(python="3.11")
def report(session: nox.Session) -> None:
    """Re-render matrix.md/.html and plots from stored results, running nothing (args: RUN ...)."""
    _harness(session, "report")


@nox.session(python="3.11")
def publish(session: nox.Session) -> None:
    """Write a static site of every stored run to reports/site/ (args: --site DIR)."""
    _harness(session, "publish")


@nox.session(python="3.11")
def images(session: nox.Session) -> None:
    """Build the Docker images a matrix needs; unchanged ones are kept (args: --config --only)."""
    _harness(session, "images")


@nox.session(name="base-image", python="3.11")
def base_image(session: nox.Session) -> None:
    """Bootstrap the local Debian base image used when public base images cannot be pulled."""
    _harness(session, "base-image")


# The interpreter running nox: a session whose Python is missing is "skipped" by nox (exit 0),
# which a CI job would read as "no regression".
@nox.session
def gate(session: nox.Session) -> None:
    """Gate a torch bump: --baseline/--candidate VERSION|RUN; exit 1 on regression, 2 when it cannot tell."""
    # 1 regression, 2 cannot tell; anything else (a failed install, a signal, a crash of the
    # interpreter) is 2: never "regression", never "no regression".
    _harness(session, "gate", codes=(1, 2), otherwise=2)


@nox.session(python="3.11")
def bisect(session: nox.Session) -> None:
    """Find the torch release where a cell's verdict changes (args: --cell CELL --good V --bad V)."""
    _harness(session, "bisect")


@nox.session(python="3.11")
def reduce(session: nox.Session) -> None:
    """Reduce a run's failing files to the smallest graph that still fails (args: RUN --cell CELL)."""
    _harness(session, "reduce")


@nox.session(python="3.11")
def view(session: nox.Session) -> None:
    """Open a cell's model.onnx (or --reduced) in Netron (args: CELL --run RUN)."""
    _harness(session, "view")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Run the test suite (unit tests and real end-to-end matrices)."""
    # Worker-side modules (parity, runners) are also unit-tested in-process: they need torch.
    links = ("--find-links", str(LOCAL_WHEELS)) if LOCAL_WHEELS.exists() else ()
    # onnxscript: torch's dynamo exporter, for the in-process tests that export with it.
    _install(session, "test", also=("torch==2.13.0", "onnx==1.23.2", "onnxscript==0.7.2", "onnxruntime==1.32.0",
                                    "openvino==2026.4.1", *links))
    if session.posargs:
        session.run("pytest", *session.posargs)
        return
    # One test file per xdist worker, a worker per core: a file's module and session fixtures (one
    # real run shared by its tests) stay in one process; environments are built once (a file lock).
    session.run("pytest", "-q", "-ra", "-n", "auto", "--dist", "loadfile", "--durations=40", "-m", "not timing")
    # Then, alone on the machine, the tests that judge real timings under a load they make
    # themselves: beside another worker's tests no core is idle and the honest verdict is
    # "cannot tell" (as CI once showed), which is not what they test.
    session.run("pytest", "-q", "-ra", "-p", "no:xdist", "-m", "timing")


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """Check the code's own habits with ruff (its rules are in pyproject.toml; CI runs this)."""
    session.install("ruff>=0.8")
    session.run("ruff", "check", "harness", "tests", "docs", "noxfile.py")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the documentation site with --strict (the hooks read the harness's own types)."""
    _install(session, "docs")
    session.run("mkdocs", "build", "--strict", *(session.posargs or ["--site-dir", "site"]))


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmark the tool: warm environment reuse, cell throughput, worker memory, timing overhead."""
    _harness(session, "bench")


@nox.session(name="gpu-check", python="3.11")
def gpu_check(session: nox.Session) -> None:
    """Run the probes on ort-cuda and tensorrt and print a table (skips with reasons without a GPU)."""
    _harness(session, "gpu-check")
