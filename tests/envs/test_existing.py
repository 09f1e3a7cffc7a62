"""Venvs made by hand outside the project, used as they are: one torch release (2.13.0, CPU),
one case, both exporters, ort-cpu and an absent openvino. The cells run in them unchanged (their
files and installed sets are the same before and after), offline (any installer call or download
fails the run), their results are reused across two paths to one installed set, an in-place
downgrade of onnxscript runs them again, and the gate between two of them works with its exit
codes. The verdicts are checked against the same interpreters driven directly
(tests/direct_onnxscript.py: no harness code)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, TESTS, TORCH_2_13, freeze, hand_venv, tree

from harness.core.record import read_records

pytestmark = pytest.mark.e2e

BODY = """exporters: [torchscript, dynamo]
opsets: [18]
runtimes: [ort-cpu, openvino]
cases: [conv_bn]
latency: {enabled: false}
"""
UNROUTABLE = "http://127.0.0.1:9/simple"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("existing")


@pytest.fixture(scope="module")
def venvs(work) -> dict[str, Path]:
    """Two venvs with the same installed set at two paths (onnxscript 0.7.2)."""
    return {name: hand_venv(work / name, *TORCH_2_13) for name in ("a", "b")}


def offline_env(work: Path) -> dict[str, str]:
    """No package index reachable, and an installer that fails and leaves a trace if called."""
    fake = work / "no-installers"
    fake.mkdir(exist_ok=True)
    for tool in ("uv", "pip", "pip3"):
        script = fake / tool
        script.write_text(f"#!/bin/sh\necho \"{tool} $*\" >> {work / 'installer-calls.log'}\nexit 1\n")
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return {**env, "PATH": f"{fake}{os.pathsep}{env['PATH']}", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1",
            "UV_INDEX_URL": UNROUTABLE, "UV_DEFAULT_INDEX": UNROUTABLE, "PIP_INDEX_URL": UNROUTABLE,
            "HTTP_PROXY": UNROUTABLE, "HTTPS_PROXY": UNROUTABLE, "http_proxy": UNROUTABLE,
            "https_proxy": UNROUTABLE}


def harness(work: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--reports", str(work / "reports"), *args],
                          cwd=ROOT, capture_output=True, text=True, env=env, check=False)


def run_in(work: Path, python: Path, name: str, env: dict[str, str] | None = None) -> Path:
    config = work / f"{name}.yaml"
    config.write_text(f"torch: [{{python: {python}}}]\n{BODY}")
    proc = harness(work, "matrix", "--config", str(config), env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return Path(proc.stdout.strip().splitlines()[-1].split("run directory: ", 1)[1])


def by_cell(run_dir: Path) -> dict[str, object]:
    return {r.cell_id: r for r in read_records(run_dir / "results.jsonl")}


def direct(python: Path, work: Path) -> str:
    cmd = [str(python), "-I", "-X", f"pycache_prefix={work / 'pycache'}", str(TESTS / "direct_onnxscript.py"),
           str(work / "direct.onnx")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


def test_a_venv_made_by_hand_runs_unchanged_offline(work, venvs):
    python = venvs["a"]
    files, installed = tree(python.parent.parent), freeze(python)
    # As on CI machines and in most images: Python would write no bytecode of its own accord.
    run_dir = run_in(work, python, "a", env={**offline_env(work), "PYTHONDONTWRITEBYTECODE": "1"})
    assert not (work / "installer-calls.log").exists(), (work / "installer-calls.log").read_text()
    assert tree(python.parent.parent) == files and freeze(python) == installed
    # The workers' bytecode went to the harness's own folder (the next worker loads it from
    # there): torch.export's dynamo modules, which only a worker imports, not the probe.
    from harness.envs.existing import pycache_dir

    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    compiled = [Path(pycache_dir(), *path.parts[1:], "torch", "_dynamo", f"convert_frame.{sys.implementation.cache_tag}.pyc")
                for path in (site.absolute(), site.resolve())]
    assert any(c.is_file() for c in compiled), compiled
    cells = by_cell(run_dir)
    ort = [r for cid, r in cells.items() if cid.endswith("ort-cpu")]
    assert len(cells) == 4 and len(ort) == 2
    for rec in ort:
        assert rec.status == "pass" and rec.torch == "2.13.0", rec
        assert rec.versions["torch_build"] == "2.13.0+cpu" and rec.versions["onnxscript"] == "0.7.2"
    for cid in ("torch2.13.0-conv_bn-torchscript-op18-openvino", "torch2.13.0-conv_bn-dynamo-op18-openvino"):
        assert cells[cid].status == "skip" and "openvino is not installed" in cells[cid].reason
    (env,) = json.loads((run_dir / "run.json").read_text())["environments"].values()
    assert env["provider"] == "existing-python" and env["existing"]["python"] == str(python)
    assert "torch==2.13.0+cpu" in env["installed"] and "onnxruntime==1.32.0" in env["installed"]
    assert env["installed_hashes"]["torch"] and env["packages"] == []
    assert "## Existing environments" in (run_dir / "matrix.md").read_text()


def test_a_second_path_to_the_same_installed_set_reuses_the_cells(work, venvs):
    first = run_in(work, venvs["a"], "a")          # the cells are in the store now
    again = by_cell(run_in(work, venvs["b"], "b"))
    for cid, rec in by_cell(first).items():
        if rec.status == "pass":
            assert again[cid].cached_from is not None and again[cid].env == rec.env, again[cid]


def test_an_in_place_downgrade_runs_the_cells_again(work, venvs):
    from harness.envs.provider import uv_bin

    python = venvs["b"]
    subprocess.run([uv_bin(), "pip", "install", "--quiet", "--python", str(python), "onnxscript==0.5.4"],
                   check=True)
    cells = by_cell(run_in(work, python, "b"))
    dynamo, script = (cells[f"torch2.13.0-conv_bn-{e}-op18-ort-cpu"] for e in ("dynamo", "torchscript"))
    assert dynamo.cached_from is None and script.cached_from is None
    assert dynamo.status == "fail" and dynamo.stage == "export" and "torch_2_11" in dynamo.error
    assert script.status == "pass" and script.versions["onnxscript"] == "0.5.4"
    # The same two interpreters driven directly: the change is onnxscript's.
    assert "max_abs" in direct(venvs["a"], work)
    assert "No module named 'onnxscript._framework_apis.torch_2_11'" in direct(python, work)


def test_the_gate_between_two_environments(work, venvs):
    config = work / "a.yaml"
    out = work / "gate"
    proc = harness(work, "gate", "--config", str(config), "--baseline-env", str(venvs["a"].parent.parent),
                   "--candidate-env", str(venvs["b"]), "--output", str(out))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    md = (out / "gate.md").read_text()
    assert md.startswith(f"## Upgrade gate: {venvs['a'].parent.parent} (torch 2.13.0+cpu) → ")
    first_section = md.split("\n### ", 2)[1]
    assert first_section.startswith("Packages that differ (1)") and "| onnxscript | 0.7.2 | 0.5.4 |" in first_section
    gate = json.loads((out / "gate.json").read_text())
    assert gate["packages_differ"] == [{"package": "onnxscript", "baseline": "0.7.2", "candidate": "0.5.4"}]
    assert gate["baseline"]["executed"] == [] and gate["candidate"]["executed"] == []   # both from the store
    verdicts = {c["exporter"]: c["verdict"] for c in gate["cells"] if c["runtime"] == "ort-cpu"}
    assert verdicts == {"dynamo": "new failure", "torchscript": "unchanged"}
    assert gate["coverage"]["compared"] == 2 and gate["coverage"]["skipped_both"] == 2
    # The other way round the dynamo cell is fixed: no regression.
    back = harness(work, "gate", "--config", str(config), "--baseline-env", str(venvs["b"]),
                   "--candidate-env", str(venvs["a"]), "--output", str(work / "gate-back"))
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert json.loads((work / "gate-back" / "gate.json").read_text())["counts"]["fixed"] == 1
    # One environment on both sides: nothing to compare (exit 2, before anything runs).
    same = harness(work, "gate", "--config", str(config), "--baseline-env", str(venvs["a"]),
                   "--candidate-env", str(venvs["a"]), "--output", str(work / "gate-same"))
    assert same.returncode == 2 and "hold the same installed packages" in same.stderr, same.stderr
    assert not (work / "gate-same").exists()


def test_an_expected_release_that_is_not_there_is_exit_2(work, venvs):
    config = work / "wrong.yaml"
    config.write_text(f"torch: [{{python: {venvs['a']}, version: '2.9.1'}}]\n{BODY}")
    proc = harness(work, "plan", "--config", str(config))
    assert proc.returncode == 2, proc.stderr
    assert f"key 'torch[0].version': expected torch 2.9.1 in {venvs['a']}" in proc.stderr
    assert "it has torch 2.13.0+cpu" in proc.stderr
