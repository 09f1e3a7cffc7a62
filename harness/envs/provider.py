"""The ``Provider`` protocol: how an ``EnvSpec`` becomes a place a worker runs in.

Two providers implement it: ``VenvProvider`` (uv virtualenvs, the default) and
``DockerProvider`` (one image per environment). The runner talks to either only through this.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Protocol

from harness.core.env import EnvMarker, EnvSpec
from harness.core.paths import import_root

PROVIDERS = ("venv", "docker")
# Providers whose worker is a process tree of the runner's (not a container's).
LOCAL_WORKERS = ("venv", "existing-python")


class EnvironmentBuildError(RuntimeError):
    """An environment could not be created or installed."""


def cannot_create(name: str, exc: OSError) -> str:
    """The message of an environment whose files cannot be written (an OSError while creating it)."""
    where = f" at {exc.filename}" if exc.filename else ""
    return f"environment {name}: cannot be created{where}: {exc.strerror or exc}"


class Provider(Protocol):
    name: str

    def skip_reason(self, spec: EnvSpec) -> str | None:
        """Why ``spec`` cannot run here (a skip, not a failure), or None."""

    def ensure(self, spec: EnvSpec) -> EnvMarker:
        """Realise the environment unless it already is; raise EnvironmentBuildError on failure."""

    def worker_command(self, spec: EnvSpec) -> list[str]:
        """The command that starts a worker in the realised environment."""

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        """The process environment of that command."""


def local_worker(provider: "Provider", spec: EnvSpec) -> bool:
    """Whether ``spec``'s worker is a process tree of ours (a venv, an existing interpreter)
    rather than a container's; a provider choosing per environment says which it uses."""
    chosen = provider.provider_for(spec) if hasattr(provider, "provider_for") else provider
    return getattr(chosen, "name", "") in LOCAL_WORKERS


def harness_process_env(threads: int) -> dict[str, str]:
    """This process's environment with the harness on PYTHONPATH (the checkout, or a folder
    linking the installed package): the worker (or the process driving its container) imports
    the harness from here, it is never installed into an environment."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(import_root()) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def uv_bin() -> str:
    """The uv executable both providers install with (the project depends on uv)."""
    found = shutil.which("uv")
    if found:
        return found
    candidate = Path(sys.executable).parent / "uv"
    if candidate.exists():
        return str(candidate)
    raise EnvironmentBuildError("uv is not installed: pip install uv (the project depends on it)")
