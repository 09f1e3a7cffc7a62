"""gate --package: which packages, how each side pins it, bad input exit 2 before anything is built,
and stored cells taken only from the side's own environment."""
from __future__ import annotations

import pytest
from helpers import TESTS, run_harness

from harness.gate.packages import PackageBump, check_bump, with_package
from harness.matrix.config import load_matrix
from harness.matrix.plan import build_plan
from harness.matrix.rules import ConfigError

FLOORS = TESTS / "matrices" / "floors.yaml"


def _matrix(tmp_path, extra: str = ""):
    path = tmp_path / "m.yaml"
    path.write_text("torch: [{version: '2.13.0', extras: ['transformers==4.48.0']}]\nexporters: [dynamo]\n"
                    "opsets: [18]\nruntimes: [ort-cpu]\ncases: [conv_bn]\n" + extra)
    return load_matrix(path), path


@pytest.mark.parametrize("package, field_or_extra", [("onnxscript", "onnxscript==0.5.0"),
                                                     ("transformers", "transformers==0.5.0")])
def test_each_side_pins_the_package_and_nothing_else(tmp_path, package, field_or_extra):
    matrix, path = _matrix(tmp_path)
    bump = PackageBump(package, "0.4.0", "0.5.0")
    spec = check_bump(matrix, bump, path)
    base, cand = (build_plan(with_package(matrix, spec, bump, v)) for v in ("0.4.0", "0.5.0"))
    b_env, c_env = base.environments[0].env, cand.environments[0].env
    assert field_or_extra in c_env.packages and field_or_extra not in b_env.packages
    assert set(b_env.packages) ^ set(c_env.packages) == {field_or_extra, field_or_extra.replace("0.5.0", "0.4.0")}
    # Same cells on both sides (compared key by key), in environments of different names.
    assert [c.cell_id for c in base.cells] == [c.cell_id for c in cand.cells]
    assert b_env.name != c_env.name


@pytest.mark.parametrize("package, expected", [("onnxruntime", "a runtime's package"),
                                               ("openvino", "a runtime's package"),
                                               ("timm", "does not install it")])
def test_packages_the_matrix_does_not_pin_are_config_errors(tmp_path, package, expected):
    matrix, path = _matrix(tmp_path)
    with pytest.raises(ConfigError, match=expected):
        check_bump(matrix, PackageBump(package, "1.0.0", "2.0.0"), path)


def test_torch_must_be_one_release(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("torch: ['2.6.0', '2.13.0']\nexporters: [dynamo]\nopsets: [18]\nruntimes: [ort-cpu]\ncases: [conv_bn]\n")
    with pytest.raises(ConfigError, match="key 'torch': --package holds torch fixed"):
        check_bump(load_matrix(path), PackageBump("onnxscript", "0.4.0", "0.5.0"), path)


@pytest.mark.parametrize("args, expected", [
    (["--package", "onnxscript", "--baseline", "0.4.0", "--candidate", "99.0.0"],
     "--candidate 99.0.0: "),
    (["--package", "onnxscript", "--baseline", "0.4.0", "--candidate", "latest"],
     "--candidate 'latest': expected a release of onnxscript"),
    (["--package", "onnxscript", "--baseline", "0.5.0", "--candidate", "0.5.0"], "the same release"),
    (["--package", "onnxscript", "--baseline", "0.5.0"], "expected --baseline and --candidate"),
])
def test_bad_package_gates_exit_2_before_anything_is_built(tmp_path, args, expected):
    proc = run_harness("--reports", str(tmp_path / "reports"), "gate", "--config", str(FLOORS), *args,
                       "--output", str(tmp_path / "gate"), check=False)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert not (tmp_path / "reports" / "runs").exists()     # nothing ran
    if "99.0.0" in args:
        assert "no version of onnxscript==99.0.0" in proc.stderr


@pytest.mark.parametrize("args, expected", [
    (["--package", "timm", "--good", "1.0.0", "--bad", "1.0.9"], "does not install it"),
    (["--package", "onnxscript", "--good", "0.6.0", "--bad", "x"], "--bad 'x': expected a release of onnxscript"),
    (["--package", "onnxscript", "--good", "0.6.0", "--bad", "0.6.0"], "the same release"),
    # Releases the index lacks: refused like the gate refuses them, before any environment is
    # built (they used to be two failing environments and exit 1).
    (["--package", "onnxscript", "--good", "0.6.0", "--bad", "99.0.0", "--releases", "0.6.0,99.0.0"],
     "--bad 99.0.0: "),
    (["--package", "onnxscript", "--good", "0.6.0", "--bad", "0.7.2", "--releases", "0.6.0,0.6.99,0.7.2"],
     "--releases 0.6.99: "),
    (["--good", "2.13.0", "--bad", "9.9.9", "--releases", "2.13.0,9.9.9"], "--bad 9.9.9: "),
])
def test_bad_package_bisects_exit_2_before_anything_is_built(tmp_path, args, expected):
    proc = run_harness("--reports", str(tmp_path / "reports"), "bisect", "--config", str(FLOORS), *args,
                       check=False)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "reports" / "runs").exists()
    if "99.0.0" in args[-1] or "0.6.99" in args[-1]:
        assert "no version of onnxscript==" in proc.stderr and "expected installable packages" in proc.stderr
