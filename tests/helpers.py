"""Helpers shared by the tests (importable as ``helpers``: pyproject puts tests/ on the path).

End-to-end tests run the tool the way a user's command does: ``run_harness`` and every other
subprocess of ``python -m harness`` use the *product environment* (``product_python``), a uv venv
holding the project's declared dependencies and nothing else, with this checkout on its path
(what ``nox -s matrix`` makes with ``pip install -e .``). The test runner's own interpreter also
has torch, onnx, ONNX Runtime and OpenVINO, for in-process unit tests of worker-side modules: a
runner that imported one of them would pass there and fail for every user.
"""
from __future__ import annotations

import functools
import hashlib
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


# Named for what it holds: one built before its packages were compiled to bytecode is built again.
PRODUCT_MARKER = ".complete-bytecode"


def product_dir() -> Path:
    """Where the product environment lives: beside the torch environments (shared by worktrees
    and kept across sessions), named by pyproject.toml and the Python it runs on."""
    from harness.core.paths import envs_dir

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + python.encode()).hexdigest()[:12]
    return envs_dir() / ".product" / f"py{python}-{key}"


@functools.cache
def product_python() -> Path:
    """The product environment's interpreter, built once (a file lock: xdist workers and other
    checkouts wait for the first) from pyproject.toml's dependencies with uv (its cache makes
    it a matter of seconds). Its packages are compiled to bytecode as they are installed, as the
    project's own sessions do (``noxfile._compile``): every end-to-end test starts the runner in
    it, and where PYTHONDONTWRITEBYTECODE is set each start would compile pandas, scipy and
    pydantic again."""
    from filelock import FileLock

    target = product_dir()
    python = target / "bin" / "python"
    if (target / PRODUCT_MARKER).exists():
        return python
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / PRODUCT_MARKER).exists():
            return python
        shutil.rmtree(target, ignore_errors=True)   # a build that was interrupted
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        subprocess.run([uv, "venv", "-q", "--python", f"{sys.version_info.major}.{sys.version_info.minor}",
                        str(target)], check=True)
        proc = subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python), "-r",
                               str(ROOT / "pyproject.toml")], capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise RuntimeError(f"the product environment could not be built:\n{proc.stderr[-3000:]}")
        (target / PRODUCT_MARKER).write_text("")
    return python


def product_env(**extra: str) -> dict[str, str]:
    """This process's environment as a user's shell in the product environment has it: its bin
    first on PATH (the test runner's venv taken off), this checkout on PYTHONPATH."""
    python = product_python()
    mine = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != mine]
    env.update(PATH=os.pathsep.join([str(python.parent), *path]), VIRTUAL_ENV=str(python.parent.parent),
               PYTHONPATH=str(ROOT))
    return {**env, **extra}


def harness_command(*args: str) -> list[str]:
    """``python -m harness ARGS`` in the product environment (run with ``product_env()``)."""
    return [str(product_python()), "-m", "harness", *args]


# Commands that run cells in torch environments (building them on a cold cache), and whether the
# test now running is marked e2e (tests/conftest.py sets it before the test's fixtures are built).
CELL_COMMANDS = {"matrix", "gate", "bisect", "reduce", "bench", "gpu-check"}
CURRENT_TEST = {"e2e": True, "id": ""}


def check_e2e_marker(args: tuple[str, ...], returncode: int) -> None:
    """A test that ran cells (a cell command that got past its input checks: exit 0 or 1) must be
    marked e2e, so that `-m "not e2e"` stays the fast path; exit 2 (bad input, nothing installed)
    is a unit test's business."""
    command = next((a for a in args if a in CELL_COMMANDS), None)
    if command and returncode in (0, 1) and not CURRENT_TEST["e2e"]:
        raise AssertionError(f"{CURRENT_TEST['id']} ran `harness {command}` (exit {returncode}) without the "
                             "e2e marker: mark the test (or its module) with pytest.mark.e2e")


def run_harness(*args: str, cwd: Path = ROOT, check: bool = True, env: dict[str, str] | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in the product environment; ``env``: variables to add."""
    proc = subprocess.run(harness_command(*args), cwd=cwd, capture_output=True, text=True,
                          env=product_env(**(env or {})), timeout=timeout)
    check_e2e_marker(args, proc.returncode)
    if check and proc.returncode != 0:
        raise AssertionError(f"harness {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_matrix(tmp_path_factory, name: str, config: str, *args: str, env: dict[str, str] | None = None) -> Path:
    """Run tests/matrices/<config> into a fresh temporary run directory; return that directory.

    A cell the matrix's own code failed on (status ``error``) fails every test that runs a test
    matrix: it is a bug of the project, never a verdict (the default matrix's nightly fails on
    one through ``history check``). ``env``: variables to add to the runner's."""
    out = tmp_path_factory.mktemp(name) / "run"
    run_harness("matrix", "--config", str(TESTS / "matrices" / config), "--output", str(out), *args, env=env)
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


# torch 2.13.0 (CPU, from /opt/wheels) and the companions its built environments use.
TORCH_2_13 = ("torch==2.13.0", "numpy==2.4.6", "onnx==1.23.2", "onnxscript==0.7.2", "onnxruntime==1.32.0")


def hand_venv(path: Path, *packages: str) -> Path:
    """A venv made by hand outside the project, as a team makes the one it deploys (``uv venv``,
    then ``uv pip install``; uv's cache links the files, so it costs seconds); its interpreter."""
    from harness.envs.provider import uv_bin

    uv = uv_bin()
    subprocess.run([uv, "venv", "--quiet", "--python", "3.11", str(path)], check=True)
    python = path / "bin" / "python"
    if packages:
        subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), *packages,
                        "--find-links", "/opt/wheels"], check=True)
    return python


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under ``root`` with its size and modification time: two equal trees
    mean nothing was written, added or removed there."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def freeze(python: Path) -> list[str]:
    """The installed set as the interpreter itself lists it (``importlib.metadata``, isolated,
    writing no bytecode there)."""
    code = ("import importlib.metadata as m; print('\\n'.join(sorted("
            "f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions())))")
    return subprocess.run([str(python), "-I", "-B", "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()
