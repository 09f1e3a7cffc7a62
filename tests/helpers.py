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
    """Run tests/matrices/<config> into a fresh temporary run directory; return that directory."""
    out = tmp_path_factory.mktemp(name) / "run"
    run_harness("matrix", "--config", str(TESTS / "matrices" / config), "--output", str(out), *args)
    return out


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
