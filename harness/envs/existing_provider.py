"""Providers of existing environments, and the provider a run talks to.

``ExistingPython`` runs a worker with an interpreter on this machine, ``ExistingImage`` in a
container of a local image; both put the harness on the path (never install it), install
nothing, and realise an environment by reporting what the probe found (``harness.envs.existing``).
``WithExisting`` is what ``make_provider`` hands a run: the run's provider (venv or docker) for
the environments it builds, these two for those that exist.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from harness.core.env import EnvMarker, EnvSpec
from harness.core.paths import import_root
from harness.core.wire import CONTAINER_MODULE, WORKER_MODULE
from harness.envs.existing import pycache_dir
from harness.envs.provider import EnvironmentBuildError, Provider, harness_process_env
from harness.runtimes import gpu_unavailable_reason


def existing_marker(spec: EnvSpec, provider: str) -> EnvMarker:
    """run.json's entry for an existing environment: what the probe found there (the full
    installed set, each distribution's files' hash, torch's build, CUDA), nothing installed."""
    found = spec.existing
    assert found is not None
    return EnvMarker.for_spec(spec, provider=provider, installed=list(found.installed), reused=True,
                              extra={"existing": found.to_dict(), "identity": found.identity,
                                     "torch_build": found.torch, "installed_hashes": dict(found.hashes)})


class ExistingPython:
    """An interpreter on this machine, used as it is."""

    name = "existing-python"

    def skip_reason(self, spec: EnvSpec) -> str | None:
        return gpu_unavailable_reason() if spec.needs_gpu else None

    def is_ready(self, spec: EnvSpec) -> bool:
        return True

    def ensure(self, spec: EnvSpec) -> EnvMarker:
        if not os.access(spec.existing.python, os.X_OK):
            raise EnvironmentBuildError(f"environment {spec.name}: {spec.existing.python} is gone or "
                                        "not executable since it was read")
        return existing_marker(spec, self.name)

    def worker_command(self, spec: EnvSpec) -> list[str]:
        return [spec.existing.python, "-m", WORKER_MODULE]

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        """The harness alone on PYTHONPATH (the environment's own path is what the probe read, no
        user site-packages), its bytecode cache outside the environment. That cache is the
        harness's own folder, so it is written even where PYTHONDONTWRITEBYTECODE is set (which
        would have every worker compile torch's sources again); the environment is never written."""
        env = harness_process_env(threads)
        env["PYTHONPATH"] = str(import_root())
        env["PYTHONNOUSERSITE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(pycache_dir())
        for var in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE"):
            env.pop(var, None)
        return env


class ExistingImage:
    """A Docker image on this machine, used as it is: each worker runs in a container of the
    image the probe read (by its id, so a tag moved since is not used), the harness mounted
    read-only from this checkout."""

    name = "existing-image"

    def __init__(self, log: Callable[[str], Any] = print) -> None:
        from harness.envs.docker.provider import DockerProvider

        self.docker = DockerProvider(log=log)   # its daemon and GPU checks

    def skip_reason(self, spec: EnvSpec) -> str | None:
        return self.docker.skip_reason(spec)

    def is_ready(self, spec: EnvSpec) -> bool:
        return True

    def ensure(self, spec: EnvSpec) -> EnvMarker:
        import docker.errors

        found = spec.existing
        try:
            now = self.docker.client.images.get(found.image).id
        except docker.errors.ImageNotFound:
            now = None
        if now != found.facts.get("image_id"):
            # The probed image still runs (by id), but the name now means another: say so.
            self.docker.log(f"image {found.image} is now {now or 'gone'}; running the image read at the "
                            f"start, {found.facts.get('image_id')}")
        return existing_marker(spec, self.name)

    def worker_command(self, spec: EnvSpec) -> list[str]:
        found = spec.existing
        cmd = [sys.executable, "-m", CONTAINER_MODULE, "--image", found.facts["image_id"],
               "--python", found.python, "--harness", str(import_root())]
        return cmd + (["--gpus"] if spec.needs_gpu else [])

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        return harness_process_env(threads)


class WithExisting:
    """The run's provider for the environments it builds, the existing-environment providers
    for the others (chosen per environment: ``provider_for``)."""

    def __init__(self, base: Provider, log: Callable[[str], Any] = print) -> None:
        self.base, self.name, self.log = base, base.name, log
        self._python = ExistingPython()
        self._image: ExistingImage | None = None

    def provider_for(self, spec: EnvSpec) -> Provider:
        if spec.existing is None:
            return self.base
        if spec.existing.image is None:
            return self._python
        if self._image is None:
            self._image = ExistingImage(self.log)
        return self._image

    def skip_reason(self, spec: EnvSpec) -> str | None:
        return self.provider_for(spec).skip_reason(spec)

    def is_ready(self, spec: EnvSpec) -> bool:
        chosen = self.provider_for(spec)
        return bool(getattr(chosen, "is_ready", lambda s: False)(spec))

    def ensure(self, spec: EnvSpec) -> EnvMarker:
        return self.provider_for(spec).ensure(spec)

    def worker_command(self, spec: EnvSpec) -> list[str]:
        return self.provider_for(spec).worker_command(spec)

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        return self.provider_for(spec).worker_env(spec, threads)

    def __getattr__(self, name: str) -> Any:   # anything else the run's provider offers
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)
