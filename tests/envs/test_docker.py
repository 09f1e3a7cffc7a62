"""The Docker provider: image recipes (no daemon needed), then a real image and matrix run.

The real tests build one small image (torch 2.13.0 CPU from the local wheel + ONNX Runtime CPU)
on whatever base is reachable (the local debootstrap base offline), run tests/matrices/docker.yaml
with both providers and require the same verdict per cell. They skip only when no Docker daemon is
reachable outside CI; under CI (CI=true) a missing daemon fails them.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import TESTS, run_harness, run_matrix

from harness.core.env import EnvSpec

DOCKER_MATRIX = TESTS / "matrices" / "docker.yaml"


def spec(**kw) -> EnvSpec:
    base = dict(name="torch2.13.0-cpu-x", torch="2.13.0", python="3.11", family="cpu",
                packages=["torch==2.13.0", "numpy==2.4.6", "onnx==1.23.2", "onnxscript==0.7.2",
                          "onnxruntime==1.32.0", "transformers==4.57.1"], runtimes=["ort-cpu"])
    return EnvSpec(**{**base, **kw})


# -- recipes and tags: no daemon needed ------------------------------------------------------------
def test_build_args_split_the_same_package_list_the_venv_installs():
    from harness.envs.docker.images import build_args

    args = build_args(spec(), "base:1")
    assert args["TORCH_VERSION"] == "2.13.0" and args["BASE_IMAGE"] == "base:1"
    assert args["COMPANION_PACKAGES"] == "numpy==2.4.6 onnx==1.23.2 onnxscript==0.7.2"
    assert args["RUNTIME_PACKAGES"] == "onnxruntime==1.32.0"
    assert args["EXTRA_PACKAGES"] == "transformers==4.57.1"
    joined = " ".join(args[k] for k in ("COMPANION_PACKAGES", "RUNTIME_PACKAGES", "EXTRA_PACKAGES"))
    assert ["torch==2.13.0", *joined.split()] == spec().packages


def test_recipe_per_runtime_family():
    from harness.envs.docker.images import recipe_for

    assert recipe_for(spec()).name == "ort-cpu"
    assert recipe_for(spec(runtimes=["openvino"])).name == "openvino"
    assert recipe_for(spec(family="gpu", runtimes=["tensorrt"])).name == "tensorrt"
    assert recipe_for(spec(family="gpu", runtimes=["ort-cuda", "tensorrt"])).name == "ort-cuda"


def test_tag_is_a_content_hash(monkeypatch):
    from harness.envs.docker import images as di

    recipe = di.RECIPES["ort-cpu"]
    tag = di.image_tag(recipe, di.build_args(spec(), "b"), [], {})
    assert tag == di.image_tag(recipe, di.build_args(spec(), "b"), [], {})
    assert tag != di.image_tag(recipe, di.build_args(spec(), "other"), [], {})
    assert tag != di.image_tag(recipe, di.build_args(spec(packages=["torch==2.13.0"]), "b"), [], {})
    monkeypatch.setattr(di, "harness_hash", lambda: "changed")
    assert tag != di.image_tag(recipe, di.build_args(spec(), "b"), [], {})


def test_index_settings_become_a_secret_env_file_without_local_folders(monkeypatch):
    from harness.envs.docker.images import index_env, index_settings

    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/pypi/simple https://mirror/simple")
    for var in ("PIP_INDEX_URL", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_INDEX"):
        monkeypatch.delenv(var, raising=False)
    env = index_env(index_settings(spec(index_url="https://proxy/simple")))
    assert "export UV_INDEX_URL=https://proxy/simple" in env
    assert "export UV_EXTRA_INDEX_URL=https://mirror/simple" in env and "file:" not in env


def test_events_are_told_from_stray_output():
    from harness.envs.docker.container import is_event

    assert is_event(b'{"event": "record", "record": {}}')
    assert not is_event(b"Warning: something") and not is_event(b'{"not": "an event"}')


def test_dockerfiles_pass_their_own_conventions():
    for path in (TESTS.parent / "images").glob("*.Dockerfile"):
        text = path.read_text()
        assert "ARG BASE_IMAGE=" in text and "--mount=type=secret,id=ca" in text, path
        assert "--mount=type=cache,target=/root/.cache/uv" in text, path
        assert text.rstrip().splitlines()[-3].startswith("USER 65534"), path


# -- a real daemon -------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def docker_ready():
    from harness.envs.docker.provider import DockerUnavailable, docker_client

    try:
        docker_client()
    except DockerUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {exc}: .ci/run starts dockerd before the tests")
        pytest.skip(f"{exc}; start dockerd to run the Docker provider tests")


def build_images(*extra: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    proc = run_harness("images", "--config", str(DOCKER_MATRIX), *extra)
    return proc.stdout + proc.stderr, time.perf_counter() - t0


@pytest.fixture(scope="session")
def built_image(docker_ready) -> str:
    out, seconds = build_images()
    print(f"\n[docker] first `images`: {seconds:.1f} s\n{out}")
    return out


@pytest.fixture(scope="session")
def docker_run_dir(built_image, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docker") / "run"
    t0 = time.perf_counter()
    run_harness("matrix", "--config", str(DOCKER_MATRIX), "--output", str(out), "--provider", "docker")
    print(f"\n[docker] matrix run in containers: {time.perf_counter() - t0:.1f} s")
    return out


@pytest.fixture(scope="session")
def venv_run_dir(tmp_path_factory) -> Path:
    return run_matrix(tmp_path_factory, "venv", DOCKER_MATRIX.name)


def verdicts(run_dir: Path) -> dict[str, tuple[str, str | None]]:
    from harness.core.record import read_records

    return {r.cell_id: (r.status, r.stage) for r in read_records(run_dir / "results.jsonl")}


@pytest.mark.e2e
def test_second_images_build_is_a_no_op(built_image):
    out, seconds = build_images()
    print(f"\n[docker] second `images`: {seconds:.1f} s")
    assert "up to date" in out and "building image" not in out, out


@pytest.mark.e2e
def test_docker_verdicts_equal_venv_verdicts(docker_run_dir, venv_run_dir):
    in_docker, in_venv = verdicts(docker_run_dir), verdicts(venv_run_dir)
    assert len(in_docker) == 8 and in_docker == in_venv
    assert in_docker["torch2.13.0-mha-torchscript-op13-ort-cpu"] == ("fail", "export")
    assert in_docker["torch2.13.0-conv_bn-dynamo-op17-ort-cpu"] == ("pass", None)


@pytest.mark.e2e
def test_docker_records_carry_versions_logs_and_bundles(docker_run_dir):
    from harness.core.record import read_records

    for r in read_records(docker_run_dir / "results.jsonl"):
        assert r.versions["torch"] == "2.13.0" and r.versions.get("onnxruntime") == "1.32.0"
        assert Path(r.log).is_file() and str(docker_run_dir) in r.log
        if r.status == "fail":
            assert (Path(r.bundle) / "inputs.npz").exists()


@pytest.mark.e2e
def test_run_json_lists_packages_installed_in_the_image(docker_run_dir):
    meta = json.loads((docker_run_dir / "run.json").read_text())
    (env,) = meta["environments"].values()
    assert env["provider"] == "docker" and env["image"].startswith("torch-onnx-matrix/ort-cpu:")
    assert any(p.startswith("torch==2.13.0") for p in env["installed"])
    assert "onnxruntime==1.32.0" in env["installed"]


@pytest.mark.e2e
def test_crash_and_hang_are_contained_in_containers(built_image, tmp_path):
    import docker

    out = tmp_path / "run"
    run_harness("matrix", "--config", str(TESTS / "matrices" / "misbehaving.yaml"), "--output",
                str(out), "--provider", "docker")
    got = verdicts(out)
    by_case = {cid.split("-")[1]: v for cid, v in got.items()}
    assert by_case["raises"][0] == "fail" and by_case["aborts"][0] == "crash"
    assert by_case["hangs"][0] == "timeout" and by_case["conv_bn"][0] == "pass"
    time.sleep(2)  # the watchdog of the killed driver removes its container
    left = docker.from_env().containers.list(all=True, filters={"label": "torch-onnx-matrix.worker"})
    assert not left, [c.name for c in left]


# -- a local image as an existing environment (docs/existing-environments.md) ------------------------
EXISTING_BODY = """exporters: [torchscript, dynamo]
opsets: [18]
runtimes: [ort-cpu]
cases: [conv_bn]
latency: {enabled: false}
"""


def built_tag(built_image: str) -> str:
    import re

    return re.search(r"torch-onnx-matrix/ort-cpu:[0-9a-f]{16}", built_image).group(0)


@pytest.mark.e2e
def test_a_local_image_is_an_existing_environment(built_image, tmp_path):
    """The image the Docker provider built, named as an existing one: its own interpreter, this
    checkout's harness mounted, the image unchanged and no container left behind."""
    import docker

    tag = built_tag(built_image)
    client = docker.from_env()
    image_id = client.images.get(tag).id
    config = tmp_path / "image.yaml"
    config.write_text(f'torch: [{{image: "{tag}"}}]\n{EXISTING_BODY}')
    out = tmp_path / "run"
    run_harness("--reports", str(tmp_path / "reports"), "matrix", "--config", str(config), "--output", str(out))
    got = verdicts(out)
    assert got == {"torch2.13.0-conv_bn-torchscript-op18-ort-cpu": ("pass", None),
                   "torch2.13.0-conv_bn-dynamo-op18-ort-cpu": ("pass", None)}
    (env,) = json.loads((out / "run.json").read_text())["environments"].values()
    assert env["provider"] == "existing-image" and env["existing"]["image_id"] == image_id
    assert env["existing"]["python"].startswith("/") and "torch==2.13.0+cpu" in env["installed"]
    assert client.images.get(tag).id == image_id    # the image is as it was: containers were removed
    assert not client.containers.list(all=True, filters={"ancestor": image_id, "label": "torch-onnx-matrix.worker"})


@pytest.mark.e2e
def test_the_gate_between_a_venv_made_by_hand_and_a_local_image(built_image, tmp_path):
    from helpers import TORCH_2_13, hand_venv

    tag = built_tag(built_image)
    venv = hand_venv(tmp_path / "venv", *TORCH_2_13)
    config = tmp_path / "cases.yaml"
    config.write_text(f"torch: ['2.13.0']\n{EXISTING_BODY}")
    out = tmp_path / "gate"
    proc = run_harness("--reports", str(tmp_path / "reports"), "gate", "--config", str(config),
                       "--baseline-env", str(venv), "--candidate-env", tag, "--output", str(out), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    gate = json.loads((out / "gate.json").read_text())
    assert gate["coverage"]["compared"] == 2 and gate["counts"]["unchanged"] == 2
    assert gate["candidate"]["environment"]["image"] == tag
    assert "onnxruntime==1.32.0" in gate["candidate"]["environment"]["installed"]
    md = (out / "gate.md").read_text()
    assert md.split("\n### ", 2)[1].startswith("Packages that differ")
    # Both sides hold the same pins; what differs is the interpreter (uv's CPython, Debian's).
    assert all(d["package"] != "onnxruntime" for d in gate["packages_differ"]), gate["packages_differ"]
