"""The venv provider compiles an environment's packages to bytecode: at install, and once for an
environment built before it did. A real uv venv with a small real package, on PyPI."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from harness.core.env import EnvSpec
from harness.envs.venv import BYTECODE, MARKER, VenvProvider

PACKAGE = "packaging==24.2"


def _spec() -> EnvSpec:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return EnvSpec(name="bytecode-probe", torch="none", python=python, family="probe",
                   packages=[PACKAGE], runtimes=[])


def _compiled(site, tag: str) -> tuple[list[str], list[str]]:
    """The package's modules, and those without a .pyc for this interpreter."""
    sources = sorted(p for p in (site / "packaging").rglob("*.py"))
    missing = [str(p) for p in sources if not (p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").is_file()]
    return [str(p) for p in sources], missing


@pytest.fixture
def built(tmp_path, monkeypatch):
    # Nothing but the provider may write bytecode: an import here or in uv would hide a miss.
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("UV_COMPILE_BYTECODE", raising=False)
    provider = VenvProvider(root=tmp_path / "envs", log=lambda line: None)
    spec = _spec()
    marker = provider.ensure(spec)
    site = next(provider.path(spec).glob("lib/python*/site-packages"))
    return provider, spec, marker, site


def test_a_new_environment_holds_bytecode_for_its_packages(built):
    provider, spec, marker, site = built
    sources, missing = _compiled(site, sys.implementation.cache_tag)
    assert sources and not missing
    assert marker.extra[BYTECODE] is True and not marker.reused
    # The environment's own Python loads them without compiling: its loader finds each .pyc valid.
    check = ("import importlib.util, sys, packaging.version as m; "
             "data = open(m.__cached__, 'rb').read(); "
             "sys.exit(0 if importlib.util.MAGIC_NUMBER == data[:4] else 1)")
    subprocess.run([str(provider.python(spec)), "-c", check], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_an_environment_built_without_bytecode_is_compiled_once_and_not_rebuilt(built):
    provider, spec, marker, site = built
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache)
    stored = json.loads((provider.path(spec) / MARKER).read_text())
    del stored[BYTECODE]     # what an environment built before the provider compiled looks like
    (provider.path(spec) / MARKER).write_text(json.dumps(stored))
    sentinel = provider.path(spec) / "kept"
    sentinel.write_text("an environment that is rebuilt loses this")

    again = provider.ensure(spec)

    assert again.reused and sentinel.exists()            # compiled in place, not reinstalled
    assert again.extra["created"] == marker.extra["created"]
    assert not _compiled(site, sys.implementation.cache_tag)[1]
    assert json.loads((provider.path(spec) / MARKER).read_text())[BYTECODE] is True
    # Once compiled, a further use compiles nothing: a removed .pyc stays removed.
    victim = next(site.rglob("__pycache__/version.*.pyc"))
    victim.unlink()
    provider.ensure(spec)
    assert not victim.exists()
