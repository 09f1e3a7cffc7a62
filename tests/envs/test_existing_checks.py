"""Existing environments, checked up front: the torch entry's schema, and an interpreter or image
that cannot be used is one line naming the key (exit 2) before anything runs. Cheap: no torch
environment is needed (a bare venv stands for one without torch)."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import hand_venv, run_harness

from harness.core.env import ExistingEnv
from harness.matrix.config import ConfigError, load_matrix

BODY = "exporters: [dynamo]\nopsets: [18]\nruntimes: [ort-cpu]\ncases: [conv_bn]\n"


def write(tmp_path: Path, torch: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(f"torch: {torch}\n{BODY}")
    return path


@pytest.mark.parametrize("torch, key, expected", [
    ('[{python: /opt/venv/bin/python, onnx: "1.17.0"}]', "torch[0]", "expected no 'onnx' pin"),
    ('[{python: "3.11"}]', "torch[0]", "an existing interpreter"),
    ('[{image: "Not An Image"}]', "torch[0].image", "expected a Docker image name"),
    ('[{image: "team/deploy:1", python: "3.11"}]', "torch[0]", "the interpreter inside it"),
    ('[{python: /opt/a/bin/python}, {python: /opt/a/bin/python}]', "torch", "each existing environment once"),
    ('[/opt/a/bin/python]', "torch[0]", "written {python: /path/to/python}"),
    ('[{python: "/opt/a\\nb"}]', "torch[0].python", "the path of an interpreter"),
])
def test_torch_entry_errors_name_the_key(tmp_path, torch, key, expected):
    path = write(tmp_path, torch)
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert f"{path}: key '{key}'" in str(err.value) and expected in str(err.value), str(err.value)


def test_an_interpreter_or_an_image_is_a_torch_entry(tmp_path):
    m = load_matrix(write(tmp_path, '["2.13.0", {python: venv/bin/python}, {image: "team/deploy:2026-11"}]'))
    assert [(t.version, t.python, t.image, t.existing) for t in m.torch] == [
        ("2.13.0", None, None, False), (None, "venv/bin/python", None, True),
        (None, None, "team/deploy:2026-11", True)]


def test_identity_is_the_installed_set_not_the_path():
    def env(python: str, **kw) -> ExistingEnv:
        base = {"python": python, "image": None, "key": "torch[0]", "torch": "2.13.0+cpu",
                "python_version": "3.11.7", "installed": ("onnx==1.23.2", "torch==2.13.0+cpu"),
                "hashes": {"onnx": "aa", "torch": "bb"}, "facts": {"platform": "linux-x86_64"}}
        return ExistingEnv(**{**base, **kw})

    a = env("/a/bin/python")
    assert a.identity == env("/b/bin/python").identity
    assert a.identity != env("/a/bin/python", hashes={"onnx": "ab", "torch": "bb"}).identity   # rebuilt in place
    assert a.identity != env("/a/bin/python", installed=("onnx==1.24.0", "torch==2.13.0+cpu")).identity
    assert a.identity != env("/a/bin/python", facts={"platform": "linux-x86_64", "image_id": "sha256:1"}).identity
    assert a.release == "2.13.0" and a.versions["onnx"] == "1.23.2"


def test_an_interpreter_that_cannot_be_used_is_exit_2_before_anything_runs(tmp_path):
    missing = write(tmp_path, f"[{{python: {tmp_path / 'nowhere' / 'bin' / 'python'}}}]")
    proc = run_harness("plan", "--config", str(missing), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "key 'torch[0].python': expected an existing interpreter" in proc.stderr

    bare = hand_venv(tmp_path / "bare")            # a Python without torch
    before = sorted(p.name for p in (tmp_path / "bare").rglob("*"))
    config = write(tmp_path, f"[{{python: {bare}}}]")
    proc = run_harness("--reports", str(tmp_path / "reports"), "matrix", "--config", str(config), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "key 'torch[0]': expected an environment where `import torch` works" in proc.stderr
    assert "No module named 'torch'" in proc.stderr
    assert not (tmp_path / "reports" / "runs").exists()          # nothing ran
    assert sorted(p.name for p in (tmp_path / "bare").rglob("*")) == before


def test_gate_env_options_are_checked_before_anything_runs(tmp_path):
    config = write(tmp_path, '["2.13.0"]')
    out = tmp_path / "gate"
    cases = [
        (["--baseline-env", str(tmp_path / "no" / "python"), "--candidate-env", "team/deploy:1"],
         f"--baseline-env '{tmp_path / 'no' / 'python'}': no such interpreter"),
        (["--baseline-env", "Not/An Image", "--candidate-env", "team/deploy:1"],
         "--baseline-env 'Not/An Image': expected an interpreter"),
        (["--baseline-env", "team/deploy:1"], "expected both --baseline-env and --candidate-env"),
        (["--baseline-env", "a:1", "--candidate-env", "b:1", "--baseline", "2.6.0"], "and none of"),
    ]
    for args, expected in cases:
        proc = run_harness("--reports", str(tmp_path / "reports"), "gate", "--config", str(config), *args,
                           "--output", str(out), check=False)
        assert proc.returncode == 2 and expected in proc.stderr, (args, proc.stderr[-2000:])
    assert not out.exists()


def test_an_image_that_is_not_on_this_machine_is_exit_2(tmp_path):
    """Never pulled: with a daemon the image must exist; without one the key says so."""
    config = write(tmp_path, '[{image: "torch-onnx-matrix/absent:never"}]')
    proc = run_harness("plan", "--config", str(config), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "key 'torch[0].image'" in proc.stderr
    assert ("is not one (docker images" in proc.stderr) or ("no Docker daemon reachable" in proc.stderr)



def test_a_python_the_worker_cannot_run_in_is_refused_naming_it():
    from harness.envs.existing import ProbeError, _found

    probe = {"python_version": "3.9.18", "implementation": "cpython", "torch": "2.6.0+cpu"}
    with pytest.raises(ProbeError) as err:
        _found(probe, "/old/bin/python", None, "torch[0]", "/old/bin/python")
    assert err.value.field == "python" and "expected CPython 3.10 or newer" in str(err.value)
    assert "/old/bin/python is cpython 3.9.18" in str(err.value)
    found = _found({**probe, "python_version": "3.10.0"}, "/new/bin/python", None, "torch[0]", "/new/bin/python")
    assert found.release == "2.6.0" and found.python == "/new/bin/python"


def test_the_packages_that_differ_come_first_in_the_order_a_reader_looks():
    from harness.gate.output import package_changes

    def env(installed: tuple[str, ...], hashes: dict[str, str], python: str = "3.11.7") -> ExistingEnv:
        return ExistingEnv(python="/p", image=None, key="k", torch="2.13.0+cpu", python_version=python,
                           installed=installed, hashes=hashes, facts={"cuda": None})

    base = env(("aaa==1", "numpy==2.4.6", "onnxruntime==1.32.0", "torch==2.13.0+cpu"), {"numpy": "x1"})
    cand = env(("numpy==2.4.6", "onnxruntime==1.33.0", "torch==2.13.0+cpu", "zzz==2"), {"numpy": "x2"},
               python="3.12.1")
    assert package_changes(base, cand) == [
        ("python", "3.11.7", "3.12.1"), ("onnxruntime", "1.32.0", "1.33.0"),
        ("numpy", "2.4.6 (files x1)", "2.4.6 (files x2)"), ("aaa", "1", "—"), ("zzz", "—", "2")]
