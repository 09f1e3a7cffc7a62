"""The Docker provider: realises an EnvSpec as an image and runs its worker in a container.

Same contract as the venv provider (ensure → marker with "installed"; worker_command and
worker_env for the runner), so the runner, its crash/timeout containment and the records are
shared. The Docker SDK talks to the daemon; only builds use the CLI (harness/docker_build.py).
Both providers put the harness on PYTHONPATH rather than installing it: the venv provider points
at this checkout, an image carries a copy in /opt/harness.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from harness.core.env import EnvMarker, EnvSpec
from harness.core.paths import envs_dir
from harness.core.wire import CONTAINER_MODULE
from harness.envs.docker.base import LOCAL_BASE, bootstrap_base, image_exists, try_pull
from harness.envs.docker.build import build_image
from harness.envs.docker.images import (
    Recipe,
    build_args,
    image_tag,
    index_settings,
    local_wheels,
    recipe_for,
)
from harness.envs.provider import EnvironmentBuildError, harness_process_env


def docker_client(timeout: int = 120):
    """A connected client, or DockerUnavailable saying why (SDK missing, daemon down)."""
    try:
        import docker
    except ImportError as exc:
        raise DockerUnavailable("the docker SDK is not installed (pip install docker)") from exc
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # any failure to reach the daemon is the same verdict: no Docker
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DockerUnavailable(f"no Docker daemon reachable ({first[:200]})") from exc
    return client


class DockerUnavailable(RuntimeError):
    """No usable Docker daemon: the provider's environments are skipped with this reason."""


class DockerProvider:
    name = "docker"

    def __init__(self, root: Path | None = None, log: Callable[[str], Any] = print) -> None:
        self.root = (root or envs_dir()) / "docker"
        self.log = log
        self._client = None
        self._unavailable: str | None = None
        self._images: dict[str, str] = {}

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client()
        return self._client

    def daemon_unavailable_reason(self) -> str | None:
        if self._client is None and self._unavailable is None:
            try:
                self.client
            except DockerUnavailable as exc:
                self._unavailable = str(exc)
        return self._unavailable

    def skip_reason(self, spec: EnvSpec) -> str | None:
        """Why ``spec`` cannot run under Docker here (None when it can): a skip, not a failure."""
        if why := self.daemon_unavailable_reason():
            return why
        if spec.needs_gpu:
            from harness.runtimes import gpu_unavailable_reason

            if why := gpu_unavailable_reason():
                return why
            runtimes = self.client.info().get("Runtimes") or {}
            if "nvidia" not in runtimes and not shutil.which("nvidia-container-runtime-hook"):
                return ("Docker cannot hand the GPU to containers: install the NVIDIA Container "
                        "Toolkit (nvidia-ctk runtime configure --runtime=docker)")
        return None

    # -- images ---------------------------------------------------------------------------------
    def plan_image(self, spec: EnvSpec) -> tuple[Recipe, str, str, bool]:
        """(recipe, tag, base, exists): the built image if any, else what a build would use.

        The tag depends on the base, so both candidates are looked up before anything is pulled:
        an image built offline on the local base is reused without touching a registry.
        """
        recipe = recipe_for(spec)
        wheels, settings = local_wheels(spec), index_settings(spec)
        forced = os.environ.get("HARNESS_DOCKER_BASE")
        bases = [forced] if forced else [recipe.default_base, LOCAL_BASE]
        for base in bases:
            tag = image_tag(recipe, build_args(spec, base), wheels, settings)
            if image_exists(self.client, tag):
                return recipe, tag, base, True
        base = bases[0]
        if not forced and not image_exists(self.client, base):
            self.log(f"pulling base image {base}")
            if why := try_pull(self.client, base):
                self.log(f"[yellow]cannot pull {base}[/] ({why}): building on the local "
                         f"bootstrap base {LOCAL_BASE} instead")
                base = LOCAL_BASE
        if base == LOCAL_BASE:
            bootstrap_base(self.client, log=self.log)
        return recipe, image_tag(recipe, build_args(spec, base), wheels, settings), base, False

    def ensure(self, spec: EnvSpec) -> EnvMarker:
        """Build the environment's image unless its tag exists; return its marker."""
        if why := self.skip_reason(spec):
            raise EnvironmentBuildError(why)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{spec.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two runs never build one image twice
            recipe, tag, base, exists = self.plan_image(spec)
            marker_path = self.root / f"{tag.replace('/', '_').replace(':', '-')}.json"
            if exists and marker_path.exists():
                self.log(f"image {tag}: up to date")
                self._images[spec.name] = tag
                marker = EnvMarker.from_dict(json.loads(marker_path.read_text()))
                marker.reused = True
                return marker
            build_s = None
            if not exists:
                self.log(f"building image {tag} ({recipe.name} on {base})")
                wheels, settings = local_wheels(spec), index_settings(spec)
                build_s = build_image(recipe, tag, build_args(spec, base), wheels, settings,
                                      self.root, self.root / "logs" / f"{spec.name}.log")
                self.log(f"built image {tag} in {build_s} s")
            else:
                self.log(f"image {tag}: up to date")
            installed = self.client.containers.run(
                tag, ["cat", "/opt/venv/installed.txt"], remove=True, network_mode="none")
            image = self.client.images.get(tag)
            marker = EnvMarker.for_spec(
                spec, provider="docker", installed=installed.decode().split(), install_s=build_s,
                extra={"image": tag, "image_id": image.id, "base_image": base, "recipe": recipe.name})
            marker_path.write_text(json.dumps(marker.to_dict(), indent=2))
            self._images[spec.name] = tag
            marker.reused = exists
            return marker

    # -- workers --------------------------------------------------------------------------------
    def worker_command(self, spec: EnvSpec) -> list[str]:
        if spec.name not in self._images:
            raise EnvironmentBuildError(f"image for {spec.name} not prepared (call ensure first)")
        cmd = [sys.executable, "-m", CONTAINER_MODULE, "--image", self._images[spec.name]]
        return cmd + (["--gpus"] if spec.needs_gpu else [])

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        """Environment of the local process that drives the container (and what it forwards)."""
        return harness_process_env(threads)
