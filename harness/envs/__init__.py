"""Environments: the ``Provider`` protocol (``provider``) and its two realisations, uv
virtualenvs (``venv``) and Docker images (``docker/``).

Takes an ``EnvSpec`` (from the plan); gives an ``EnvMarker`` (what was installed), a worker
command and its process environment. Nothing here decides which environments a matrix needs.
"""
from __future__ import annotations

from typing import Any, Callable

from harness.envs.provider import PROVIDERS, Provider


def make_provider(name: str, log: Callable[[str], Any] = print) -> Provider:
    if name == "venv":
        from harness.envs.venv import VenvProvider

        return VenvProvider(log=log)
    if name == "docker":
        from harness.envs.docker.provider import DockerProvider

        return DockerProvider(log=log)
    raise ValueError(f"unknown provider {name!r}; expected one of {PROVIDERS}")
