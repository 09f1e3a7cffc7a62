"""The installed tool: a non-editable `uv pip install` of this checkout into a fresh venv gives
`torch-onnx-matrix`, which works in another repository: `init`, `plan`, a real one-cell `matrix`
run whose workers import the installed harness (not this checkout), and the environments cache
in the user cache directory."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

MODELS = '''import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv holding a wheel-built install of this checkout (no link back to it)."""
    uv = shutil.which("uv")
    assert uv, "uv is missing (a dependency of the project)"
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([uv, "venv", "-q", "--python", "3.11", str(venv)], check=True)
    # A copy of the tracked tree: the build writes egg-info beside the sources.
    src = venv.parent / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(src)   # nothing of the sources is left to import from
    return venv


def _env(tmp_path: Path, installed: Path, **extra: str) -> dict[str, str]:
    """A user's shell with the installed tool's venv first on PATH (the test runner's taken off)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HARNESS_ENVS_DIR", "VIRTUAL_ENV")}
    mine = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != mine]
    return {**env, "PATH": os.pathsep.join([str(installed / "bin"), *path]),
            "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "their-repo"
    repo.mkdir()
    (repo / "models.py").write_text(MODELS)
    (repo / "requirements.txt").write_text("torch==2.6.0\nnumpy==2.2.6\n")
    return repo


@pytest.mark.e2e
def test_installed_command_init_and_plan(installed, tmp_path):
    tool = installed / "bin" / "torch-onnx-matrix"
    assert tool.exists()
    repo = _repo(tmp_path)
    env = _env(tmp_path, installed)
    help_text = subprocess.run([str(tool), "--help"], cwd=repo, env=env, capture_output=True, text=True).stdout
    for sub in ("matrix", "plan", "merge", "report", "publish", "gate", "bisect", "view", "reduce",
                "images", "base-image", "bench", "gpu-check", "init"):
        assert sub in help_text, sub
    init = subprocess.run([str(tool), "init"], cwd=repo, env=env, capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    assert (repo / "matrix.yaml").exists() and (repo / ".github" / "workflows" / "torch-onnx-gate.yml").exists()
    assert "from models import TinyNet" in (repo / "onnx_cases.py").read_text()
    assert '"2.6.0", "2.13.0"' in (repo / "matrix.yaml").read_text()
    again = subprocess.run([str(tool), "init"], cwd=repo, env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "already exist" in again.stderr
    plan = subprocess.run([str(tool), "plan"], cwd=repo, env=env, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    assert "torch2.6.0-tinynet-dynamo-op18-ort-cpu" in plan.stdout
    assert plan.stdout.strip().endswith("8 cells in 2 environments")
    where = subprocess.run([str(installed / "bin" / "python"), "-c",
                            "from harness.core import paths; print(paths.envs_dir()); print(paths.import_root())"],
                           cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert Path(where[0]) == tmp_path / "cache" / "torch-onnx-matrix" / "envs"
    assert [p.name for p in Path(where[1]).iterdir()] == ["harness"]   # nothing else importable
    assert (Path(where[1]) / "harness").resolve().parent.name == "site-packages"


@pytest.mark.e2e
def test_installed_command_runs_a_matrix_in_another_directory(installed, tmp_path):
    """A real cell, its worker importing the installed harness; the store is ./reports."""
    repo = _repo(tmp_path)
    (repo / "cases.py").write_text("import torch\n\n\ndef mlp():\n    return torch.nn.Linear(4, 2).eval(), "
                                   "(torch.randn(2, 4),), {0: {0: 'batch'}}\n")
    (repo / "m.yaml").write_text('torch: ["2.13.0"]\nexporters: [dynamo]\nopsets: [18]\ncases: ["cases.py:*"]\n')
    envs = Path(os.environ.get("HARNESS_ENVS_DIR", ROOT / ".envs"))
    env = _env(tmp_path, installed, HARNESS_ENVS_DIR=str(envs))   # the shared environments: no torch download
    proc = subprocess.run([str(installed / "bin" / "torch-onnx-matrix"), "matrix", "--config", "m.yaml"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = next((repo / "reports" / "runs").iterdir()) / "results.jsonl"
    import json

    record = json.loads(results.read_text().splitlines()[0])
    assert record["status"] == "pass" and record["case"] == "mlp", record
