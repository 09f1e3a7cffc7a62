"""The gate's sides from dependency files: each format read from realistic files, the bump PRs
Dependabot and Renovate write (a git repository per scenario: the base files committed on main,
the pull request's in the working tree), and `gate --from-deps` end to end where no bump."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, product_env, product_python

from harness.gate.deps import gate_matrix, read_sides
from harness.matrix.deps import (
    parse_lock,
    parse_pipfile_lock,
    parse_pyproject,
    parse_requirements,
    read_pins,
    working_tree_reader,
)
from harness.matrix.rules import ConfigError

FIXTURES = ROOT / "tests" / "fixtures" / "deps"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args], cwd=repo,
                   check=True, capture_output=True)


def _pull_request(tmp_path: Path, scenario: str) -> Path:
    """A repository whose main holds the scenario's base files and whose working tree its head files."""
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / scenario / "base", repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-qb", f"{scenario}-bump")
    shutil.copytree(FIXTURES / scenario / "head", repo, dirs_exist_ok=True)
    return repo


def test_requirements_with_hashes_includes_and_markers():
    text = (FIXTURES / "dependabot-requirements" / "base" / "requirements.txt").read_text()
    assert parse_requirements(text, "requirements.txt") == {
        "filelock": "3.16.1", "numpy": "2.2.6", "torch": "2.6.0", "typing-extensions": "4.12.2"}
    folder = FIXTURES / "dependabot-requirements" / "base"
    dev = parse_requirements((folder / "requirements-dev.txt").read_text(), "requirements-dev.txt",
                             working_tree_reader(folder))
    assert dev["torch"] == "2.6.0" and dev["onnx"] == "1.17.0" and dev["onnxruntime"] == "1.20.1"
    assert "-e" not in dev


def test_ranges_are_not_pins_and_bad_lines_are_named():
    assert parse_requirements("torch>=2.6,<2.14\nnumpy\ntorch-geometric==2.6.1\n", "r.txt") == {
        "torch-geometric": "2.6.1"}
    with pytest.raises(ConfigError, match=r"r.txt:2: expected a requirement"):
        parse_requirements("numpy==2.2.6\ntorch=2.6.0\n", "r.txt")
    with pytest.raises(ConfigError, match="includes missing.txt"):
        parse_requirements("-r missing.txt\n", "r.txt", lambda path: None)


def test_poetry_pyproject_and_lock():
    folder = FIXTURES / "renovate-poetry" / "base"
    pins = parse_pyproject((folder / "pyproject.toml").read_text(), "pyproject.toml")
    assert pins["torch"] == "2.6.0" and pins["torchvision"] == "0.21.0" and pins["onnxruntime"] == "1.20.1"
    assert "onnx" not in pins and "python" not in pins    # ^1.17 is a range
    lock = parse_lock((folder / "poetry.lock").read_text(), "poetry.lock")
    assert lock["torch"] == "2.6.0" and lock["torchvision"] == "0.21.0" and lock["onnx"] == "1.17.0"


def test_uv_lock_with_platform_split_builds():
    lock = parse_lock((FIXTURES / "renovate-uv" / "head" / "uv.lock").read_text(), "uv.lock")
    # Per platform: the darwin build's marker does not hold here, the +cpu build's does.
    assert lock["torch"] == ("2.13.0" if sys.platform == "darwin" else "2.13.0+cpu") and lock["onnxscript"] == "0.7.2"
    with pytest.raises(ConfigError, match=r"uv.lock:5: locks torch 2.13.0, but uv.lock:1 locks torch 2.6.0"):
        parse_lock('[[package]]\nname = "torch"\nversion = "2.6.0"\n\n[[package]]\nname = "torch"\n'
                   'version = "2.13.0"\n', "uv.lock")


def test_pipfile_lock():
    lock = parse_pipfile_lock((FIXTURES / "pipenv" / "base" / "Pipfile.lock").read_text(), "Pipfile.lock")
    assert lock == {"filelock": "3.16.1", "numpy": "2.2.6", "torch": "2.6.0", "pytest": "8.3.4"}


def test_a_lock_outranks_the_ranges_and_conflicting_requirements_are_refused(tmp_path):
    folder = FIXTURES / "renovate-uv" / "base"
    pins = read_pins(["uv.lock", "pyproject.toml"], working_tree_reader(folder))
    assert pins.torch in ("2.6.0", "2.6.0+cpu") and pins.sources["torch"] == "uv.lock"
    assert pins.versions["transformers"] == "4.57.6"
    (tmp_path / "requirements.txt").write_text("torch==2.6.0\n")
    (tmp_path / "requirements-gpu.txt").write_text("torch==2.7.1\n")
    with pytest.raises(ConfigError, match="requirements.txt:1: pins torch==2.6.0, but requirements-gpu.txt:1 pins torch==2.7.1"):
        read_pins(["requirements-gpu.txt", "requirements.txt"], working_tree_reader(tmp_path))


@pytest.mark.parametrize("scenario, sources, companions", [
    ("dependabot-requirements", "requirements.txt", {"numpy": ("2.2.6", "2.2.6")}),
    ("renovate-poetry", "poetry.lock", {"torchvision": ("0.21.0", "0.28.0"), "onnx": ("1.17.0", "1.17.0")}),
    ("renovate-uv", "uv.lock", {"onnxscript": ("0.2.7", "0.7.2"), "transformers": ("4.57.6", "4.57.6")}),
    ("pipenv", "Pipfile.lock", {"numpy": ("2.2.6", "2.4.6")}),
])
def test_bump_pull_requests(tmp_path, scenario, sources, companions):
    sides = read_sides("main", _pull_request(tmp_path, scenario))
    assert sides.bump
    assert sides.baseline.torch.split("+")[0] == "2.6.0" and sides.candidate.torch.split("+")[0] == "2.13.0"
    assert sides.baseline.sources["torch"] == sides.candidate.sources["torch"] == sources
    for name, (before, after) in companions.items():
        assert (sides.baseline.versions[name], sides.candidate.versions[name]) == (before, after)


def test_gate_matrix_carries_the_pins_and_keeps_case_paths(tmp_path):
    repo = _pull_request(tmp_path, "renovate-poetry")
    (repo / "cases").mkdir()
    (repo / "cases" / "vision.py").write_text("def net():\n    return 1, 2\n")
    (repo / "matrix.yaml").write_text(
        'torch: ["2.6.0", {version: "2.13.0", extras: ["timm==1.0.31"]}]\nexporters: [dynamo]\n'
        'opsets: [18]\ncases: ["cases/vision.py:*", {target: "cases/vision.py:net", name: again}]\n')
    sides = read_sides("main", repo)
    written = gate_matrix(sides, repo / "matrix.yaml", tmp_path / "gate")
    data = yaml.safe_load(written.read_text())
    assert data["torch"] == [
        {"version": "2.6.0", "onnx": "1.17.0", "extras": ["torchvision==0.21.0"]},
        {"version": "2.13.0", "onnx": "1.17.0", "extras": ["timm==1.0.31", "torchvision==0.28.0"]}]
    assert data["cases"] == [f"{repo}/cases/vision.py:*", {"target": f"{repo}/cases/vision.py:net", "name": "again"}]
    from harness.matrix.config import load_matrix

    matrix = load_matrix(written)   # the ordinary loader reads it: globs and paths resolve
    assert [c.label for c in matrix.cases] == ["net", "again"]


def test_no_pin_and_unknown_ref_are_bad_input(tmp_path):
    repo = _pull_request(tmp_path, "dependabot-requirements")
    with pytest.raises(ConfigError, match="no-such-branch: not a commit"):
        read_sides("no-such-branch", repo)
    (repo / "requirements.txt").write_text("numpy==2.2.6\n")
    (repo / "requirements-dev.txt").write_text("pytest==8.3.4\n")
    with pytest.raises(ConfigError, match=r"the candidate \(the working tree\) pins no torch"):
        read_sides("main", repo)


def _cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = product_env(GITHUB_STEP_SUMMARY=str(repo / "summary.md"))
    return subprocess.run([str(product_python()), "-c", "import sys; from harness.cli import console_main; "
                           "sys.exit(console_main())", *args], cwd=repo, env=env, capture_output=True, text=True)


def test_gate_from_deps_without_a_torch_bump_passes_at_once(tmp_path):
    repo = _pull_request(tmp_path, "dependabot-requirements")
    (repo / "requirements.txt").write_text((repo / "requirements.txt").read_text().replace("torch==2.13.0", "torch==2.6.0")
                                           .replace("numpy==2.2.6", "numpy==2.2.5"))
    (repo / "matrix.yaml").write_text("torch: [\"2.6.0\"]\nexporters: [dynamo]\nopsets: [18]\ncases: [mha]\n")
    proc = _cli(repo, "gate", "--from-deps", "main")
    assert proc.returncode == 0, proc.stderr
    assert "no torch bump" in proc.stdout and "no torch bump" in (repo / "summary.md").read_text()
    assert not (repo / "reports").exists()   # nothing was run or written to the store
    proc = _cli(repo, "gate", "--from-deps", "main", "--baseline", "2.6.0")
    assert proc.returncode == 2 and "not both" in proc.stderr
    proc = _cli(repo, "gate")
    assert proc.returncode == 2 and "expected --baseline and --candidate" in proc.stderr


def _workflow(tmp_path: Path) -> dict:
    from harness.matrix.scaffold import scaffold

    return yaml.safe_load(scaffold(tmp_path).workflow)


def test_init_workflow_is_the_reusable_workflow_s_job():
    """What `init` writes and what .github/workflows/torch-onnx-gate.yml offers to callers run the
    same steps; only how the matrix file and the tool are given differs."""
    reusable = yaml.safe_load((ROOT / ".github" / "workflows" / "torch-onnx-gate.yml").read_text())
    written = _workflow(ROOT)
    assert written["jobs"] == reusable["jobs"]
    assert set(reusable[True]) == {"workflow_call"} and set(reusable[True]["workflow_call"]["inputs"]) == {"config", "tool"}
    paths = written[True]["pull_request"]["paths"]
    assert {"requirements*.txt", "pyproject.toml", "uv.lock", "poetry.lock", "Pipfile.lock", "matrix.yaml"} <= set(paths)


def test_init_workflow_passes_the_schema_and_zizmor(tmp_path):
    from harness.matrix.scaffold import scaffold

    path = tmp_path / "torch-onnx-gate.yml"
    path.write_text(scaffold(tmp_path).workflow)
    from test_workflows import _tool, _zizmor

    proc = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serious = [f["ident"] for f in _zizmor(path) if f["determinations"]["severity"] in ("Medium", "High")]
    assert not serious, serious


@pytest.mark.e2e
def test_init_workflow_blocks_a_bump_into_a_regression(tmp_path):
    """The judged path: a repository with its own pin, `init`, then a pull request moving the pin;
    the workflow's own steps run here (tests/matrix/workflow_local.py) and the gate step exits 1 on
    the known regression. conv_bn · dynamo · op17 passes on torch 2.13.0 and fails the onnx checker
    on 2.6.0, so the pull request moves the pin from 2.13.0 to 2.6.0."""
    sys.path.insert(0, str(ROOT / "tests" / "matrix"))
    from workflow_local import run_job

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "requirements.txt").write_text("torch==2.13.0\n")
    proc = _cli(repo, "init")
    assert proc.returncode == 0, proc.stderr
    (repo / "matrix.yaml").write_text('torch: ["2.13.0", "2.6.0"]\nexporters: [dynamo]\nopsets: [17]\n'
                                      'cases: [conv_bn, "onnx_cases.py:*"]\n')
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "remote", "add", "origin", str(repo))
    _git(repo, "fetch", "-q", "origin")
    _git(repo, "checkout", "-qb", "renovate/torch-2.x")
    (repo / "requirements.txt").write_text("torch==2.6.0\n")
    spec = yaml.safe_load((repo / ".github" / "workflows" / "torch-onnx-gate.yml").read_text())
    ctx = {"github": {"base_ref": "main"}, "runner": {"os": "Linux"}, "inputs": {}, "vars": {},
           "needs": {}, "workflow_env": spec["env"]}
    log: list[str] = []
    with pytest.raises(RuntimeError, match=r"step failed \(1\)") as failed:
        run_job("gate", spec["jobs"]["gate"], ctx, repo, tmp_path / "artifacts", repo / "matrix.yaml", log)
    assert "conv_bn · dynamo · op17 · ort-cpu" in str(failed.value)
    gate = repo / "reports" / "gates" / "pr"
    assert "regression" in (gate / "gate.md").read_text() and (gate / "junit.xml").exists()
    assert "torch 2.13.0 → 2.6.0" in (repo / ".summary").read_text()
