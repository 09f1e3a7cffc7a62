"""Existing environments: an interpreter or a local Docker image used as it is, read before any
cell is planned.

A torch entry ``{python: /opt/venv/bin/python}`` or ``{image: team/deploy:2026-11}`` names an
environment the matrix never builds, resolves, installs into or writes inside. Its interpreter
runs ``harness/worker/existing_facts.py`` (isolated, its bytecode cache pointed outside the environment) and says
what is installed there: torch and its build, CUDA, every distribution with its version and
files' hashes, the runtime modules importable. The cells' ``torch`` is the release found there.

Everything is checked up front (the interpreter runs, its Python is one the worker supports,
``import torch`` works, the image exists on this machine): a problem is one ``ConfigError`` line
naming the key (exit 2), before any cell runs.
"""
from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.env import ExistingEnv
from harness.core.paths import HARNESS_DIR, envs_dir
from harness.core.wire import EXISTING_FACTS_FILE, EXISTING_FACTS_PREFIX
from harness.matrix.rules import ConfigError
from harness.runtimes import RUNTIMES

if TYPE_CHECKING:
    from harness.matrix.config import Matrix, TorchSpec

PROBE_FILE = HARNESS_DIR / EXISTING_FACTS_FILE
PREFIX = EXISTING_FACTS_PREFIX
PROBE_TIMEOUT_S = 600        # a cold `import torch` of a CUDA build from a slow disk takes minutes
MIN_PYTHON = (3, 10)         # the worker's own floor (pyproject's requires-python)
MODULES = sorted({r.module for r in RUNTIMES.values() if r.module})


class ProbeError(Exception):
    """An existing environment cannot be used: the message says why (the caller names the key)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field   # the key of the torch entry at fault: "python", "image", "version" or ""


def pycache_dir() -> Path:
    """Where the bytecode of an existing interpreter's modules goes (never inside it)."""
    return envs_dir() / "existing-pycache"


def interpreter_path(python: str, base: Path) -> str:
    """``python`` as an absolute path (relative to ``base``, ``~`` expanded), not resolved: a
    venv's ``bin/python`` is a link whose folder makes it that venv. A venv's folder stands for
    its ``bin/python``."""
    path = Path(os.path.expanduser(python))
    path = Path(os.path.abspath(path if path.is_absolute() else base / path))
    if path.is_dir() and (path / "bin" / "python").exists():
        path = path / "bin" / "python"
    return str(path)


def _parse(stdout: str, stderr: str, where: str) -> dict:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(PREFIX)), None)
    if line is None:
        tail = " ".join((stderr or stdout).strip().splitlines()[-3:])[:400]
        raise ProbeError("python", f"{where} did not run the environment probe: {tail or 'no output'}")
    return json.loads(line[len(PREFIX):])


def _found(data: dict, python: str, image: str | None, key: str, where: str,
           facts: dict | None = None) -> ExistingEnv:
    version = data.get("python_version", "?")
    try:
        too_old = tuple(int(x) for x in version.split(".")[:2]) < MIN_PYTHON
    except ValueError:
        too_old = True
    if data.get("implementation", "cpython") != "cpython" or too_old:
        raise ProbeError("python", f"expected CPython {'.'.join(map(str, MIN_PYTHON))} or newer (the harness's "
                                   f"worker runs there); {where} is {data.get('implementation')} {version}")
    if "torch" not in data:
        raise ProbeError("", f"expected an environment where `import torch` works; in {where} it fails: "
                             f"{' '.join(str(data.get('torch_error')).split())[:300]}")
    keep = ("executable", "prefix", "platform", "cuda", "cuda_available")
    return ExistingEnv(python=(data.get("executable") or python) if image else python, image=image, key=key,
                       torch=data["torch"], python_version=version, installed=tuple(data.get("installed", [])),
                       hashes=dict(data.get("hashes", {})), modules=tuple(data.get("modules", [])),
                       facts={**{k: data[k] for k in keep if k in data}, **(facts or {})})


def probe_interpreter(python: str, key: str) -> ExistingEnv:
    """What an interpreter on this machine has installed (it runs isolated; nothing written)."""
    # Its bytecode goes to the cache the workers share, outside the environment.
    cmd = [python, "-I", "-X", f"pycache_prefix={pycache_dir()}", "-c", PROBE_FILE.read_text(), *MODULES]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise ProbeError("python", f"expected an existing interpreter; {python}: "
                                   f"{exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise ProbeError("python", f"{python} did not answer within {PROBE_TIMEOUT_S} s") from None
    return _found(_parse(proc.stdout, proc.stderr, python), python, None, key, python)


def probe_image(image: str, python: str | None, key: str) -> ExistingEnv:
    """What a local Docker image's interpreter has installed (a container without network,
    removed at once; nothing is pulled or built)."""
    import docker.errors

    from harness.envs.docker.provider import DockerUnavailable, docker_client

    try:
        client = docker_client()
    except DockerUnavailable as exc:
        raise ProbeError("image", f"{exc}; expected a running Docker daemon to use image {image}") from None
    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ProbeError("image", f"expected a Docker image on this machine (an existing environment is never "
                                  f"pulled or built): {image} is not one (docker images; docker pull {image})") from None
    except docker.errors.APIError as exc:
        raise ProbeError("image", f"cannot read image {image}: {exc.explanation or exc}") from None
    tried = []
    for candidate in [python] if python else ["python3", "python"]:
        try:
            out = client.containers.run(found.id, ["-I", "-c", PROBE_FILE.read_text(), *MODULES],
                                        entrypoint=[candidate], network_mode="none", remove=True,
                                        stdout=True, stderr=True)
        except docker.errors.ContainerError as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
            raise ProbeError("python", f"image {image}: {candidate} did not run the environment probe: "
                                       f"{' '.join(err.strip().splitlines()[-3:])[:400]}") from None
        except docker.errors.APIError as exc:   # the executable is not in the image
            tried.append(f"{candidate}: {' '.join(str(exc.explanation or exc).split())[:200]}")
            continue
        text = out.decode(errors="replace")
        return _found(_parse(text, text, f"image {image}"), candidate, image, key, f"image {image}",
                      {"image_id": found.id, "image_tags": list(found.tags)})
    raise ProbeError("python", f"image {image}: no Python interpreter found ({'; '.join(tried)}); expected "
                               "'python:' to name the one inside it")


def probe_entry(spec: "TorchSpec", key: str, base: Path) -> ExistingEnv:
    if spec.image is not None:
        return probe_image(spec.image, spec.python, key)
    return probe_interpreter(interpreter_path(spec.python, base), key)


def probe_matrix(matrix: "Matrix", config: Path, keys: dict[int, str] | None = None) -> "Matrix":
    """The matrix with each existing environment read (in parallel): its entry's ``version`` is
    the release found there. ConfigError (every problem, one line each, naming the file and the
    key, or the option in ``keys`` by entry index) when one cannot be used. A matrix without
    existing environments is returned as it is, nothing run."""
    todo = [(i, t) for i, t in enumerate(matrix.torch) if t.existing and not t.probed]
    if not todo:
        return matrix
    base = Path(config).resolve().parent
    named = {i: (keys or {}).get(i) or f"torch[{i}]" for i, _ in todo}

    def read(item: tuple[int, "TorchSpec"]) -> ExistingEnv | ProbeError:
        i, spec = item
        try:
            return probe_entry(spec, named[i], base)
        except ProbeError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(4, len(todo))) as pool:
        results = dict(zip((i for i, _ in todo), pool.map(read, todo)))
    problems, entries = [], list(matrix.torch)
    for i, spec in todo:
        found = results[i]
        if isinstance(found, ProbeError):
            field = f".{found.field}" if found.field and not named[i].startswith("--") else ""
            where = named[i] if named[i].startswith("--") else f"{config}: key '{named[i]}{field}'"
            problems.append(f"{where}: {found}")
            continue
        if spec.version is not None and spec.version != found.release:
            key = named[i] if named[i].startswith("--") else f"{config}: key '{named[i]}.version'"
            problems.append(f"{key}: expected torch {spec.version} in {found.where} (as this key says); "
                            f"it has torch {found.torch}")
            continue
        entries[i] = spec.read_as(found)
    if problems:
        raise ConfigError("\n".join(problems))
    releases: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.version in releases:
            j = releases[entry.version]
            raise ConfigError(f"{config}: key 'torch': {named.get(j, f'torch[{j}]')} ({entries[j].where}) and "
                              f"{named.get(i, f'torch[{i}]')} ({entry.where}) both hold torch {entry.version}; "
                              "cells are named by their torch release: expected each release once (to compare "
                              "two environments of one release: gate --baseline-env A --candidate-env B)")
        releases[entry.version] = i
    return matrix.model_copy(update={"torch": entries})
