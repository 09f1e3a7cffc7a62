"""Environments: the ``Provider`` protocol (``provider``) and its two realisations, uv
virtualenvs (``venv``) and Docker images (``docker/``); existing environments, an interpreter or
a local image used as it is (``existing``: read them; ``existing_provider``: run in them).

Takes an ``EnvSpec`` (from the plan); gives an ``EnvMarker`` (what was installed), a worker
command and its process environment. Nothing here decides which environments a matrix needs.
"""
from __future__ import annotations

from typing import Any, Callable

from harness.envs.provider import PROVIDERS, Provider


def make_provider(name: str, log: Callable[[str], Any] = print) -> Provider:
    """The provider a run talks to: ``name``'s for the environments it builds, an existing
    environment's own for those used as they are (``existing_provider.WithExisting``)."""
    from harness.envs.existing_provider import WithExisting

    return WithExisting(_base_provider(name, log), log)


def _base_provider(name: str, log: Callable[[str], Any]) -> Provider:
    if name == "venv":
        from harness.envs.venv import VenvProvider

        return VenvProvider(log=log)
    if name == "docker":
        from harness.envs.docker.provider import DockerProvider

        return DockerProvider(log=log)
    raise ValueError(f"unknown provider {name!r}; expected one of {PROVIDERS}")
