"""Before anything is installed: can every environment a plan still has to build be resolved?

``uv pip compile`` (a resolution: package metadata only, nothing installed) of each environment
that is not realised yet, with the index settings its install will use, and ``uv python list``
for each Python version. Every problem is reported together as ``ConfigError`` lines that name
the matrix file and the key to change, before the first environment is built.
"""
from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement

from harness.core.env import EnvSpec
from harness.envs.provider import EnvironmentBuildError, uv_bin
from harness.matrix.config import COMPANIONS, Matrix
from harness.matrix.plan import Plan
from harness.matrix.rules import ConfigError
from harness.runtimes import runtime_info

RESOLVE_TIMEOUT_S = 300


@dataclass
class Unresolvable:
    """An environment uv cannot resolve: the package its message blames, and that message."""

    spec: EnvSpec
    package: str | None
    message: str


def _uv(args: list[str], stdin: str | None = None, timeout: float = RESOLVE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([uv_bin(), *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def _cause(stderr: str) -> str:
    """uv's reason as one line: the 'cause:' / 'hint:' text, else its last error line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    picked = [ln.split(":", 1)[1].strip() if ln.startswith(("cause:", "hint:")) else ln
              for ln in lines if ln.startswith(("cause:", "hint:", "╰─▶"))]
    text = " ".join(picked or lines[-3:] or ["uv gave no reason"]).replace("╰─▶", "").strip()
    return text if len(text) <= 400 else text[:399] + "…"


def _blamed(message: str, spec: EnvSpec) -> str | None:
    """The requested package uv's message is about (the first one it names), or None."""
    names = {}
    for req in spec.packages:
        try:
            names[Requirement(req).name.lower()] = req
        except InvalidRequirement:
            continue
    found = [(m.start(), n) for n in names
             for m in re.finditer(rf"(?<![\w-]){re.escape(n)}(?=[=<>!~ ,`)]|$)", message.lower())]
    return min(found)[1] if found else None


def resolve_spec(spec: EnvSpec) -> Unresolvable | None:
    """Resolve one environment's requirements with uv, as its install would; None when it resolves."""
    args = ["pip", "compile", "-", "--python-version", spec.python, "--no-header", "--quiet",
            *spec.index_args()]
    try:
        proc = _uv(args, stdin="\n".join(spec.packages) + "\n")
    except subprocess.TimeoutExpired:
        return Unresolvable(spec, None, f"uv could not resolve it within {RESOLVE_TIMEOUT_S} s "
                                        "(is the package index reachable?)")
    except (OSError, EnvironmentBuildError) as exc:
        return Unresolvable(spec, None, f"uv could not be run: {exc}")
    if proc.returncode == 0:
        return None
    message = _cause(proc.stderr or proc.stdout)
    return Unresolvable(spec, _blamed(message, spec), message)


def python_unavailable(version: str) -> str | None:
    """Why uv cannot provide this Python (installed or as a download), or None when it can."""
    try:
        proc = _uv(["python", "list", version, "--output-format", "json"], timeout=60)
        found = json.loads(proc.stdout or "[]") if proc.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired, EnvironmentBuildError) as exc:
        return f"uv could not list Python versions ({exc})"
    if found is None:
        return _cause(proc.stderr)
    if not found:
        return f"uv can neither find nor download a Python {version}"
    return None


def _config_key(matrix: Matrix, spec: EnvSpec, package: str | None, torch_key: dict[str, str]) -> str:
    """The key of the matrix file that sets the blamed package of this environment."""
    index = next((i for i, t in enumerate(matrix.torch) if t.version == spec.torch), None)
    base = torch_key.get(spec.torch) or (f"torch[{index}]" if index is not None else f"torch {spec.torch}")
    if index is None:
        return base
    entry = matrix.torch[index]
    if package is None or package == "torch":
        return base
    if package in COMPANIONS:
        return f"{base}.{package}" if getattr(entry, package) else base
    for j, rt in enumerate(matrix.runtimes):
        if rt.label in spec.runtimes and runtime_info(rt.name).package == package:
            return f"runtimes[{j}]" + (".version" if rt.version else "")
    for j, extra in enumerate(entry.extras):
        try:
            if Requirement(extra).name.lower() == package:
                return f"{base}.extras[{j}]"
        except InvalidRequirement:
            continue
    return base


def preflight(plan: Plan, config: Path, skip: Callable[[EnvSpec], str | None] = lambda s: None,
              ready: Callable[[EnvSpec], bool] = lambda s: False,
              torch_key: dict[str, str] | None = None, jobs: int = 4) -> None:
    """Resolve every environment of ``plan`` that is neither realised (``ready``) nor skipped
    here (``skip`` gives a reason); raise ConfigError naming file and key for each one that
    cannot be installed. ``torch_key`` names where a torch version came from when the file does
    not list it (the gate's ``--candidate``)."""
    torch_key = torch_key or {}
    matrix = plan.matrix
    # An existing environment (an interpreter, a local image) is never resolved: nothing is installed there.
    todo = [e.env for e in plan.environments
            if e.cells and e.env.existing is None and not skip(e.env) and not ready(e.env)]
    problems: dict[tuple[str, str], str] = {}   # one line per key and reason
    if any(e.cells and not skip(e.env) for e in plan.environments):
        problems.update(unresolvable_releases(matrix, config, jobs))
    pythons = sorted({s.python for s in todo})
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        py_checks = dict(zip(pythons, pool.map(python_unavailable, pythons)))
        bad_python = {v for v, why in py_checks.items() if why}
        for version in sorted(bad_python):
            spec = next(s for s in todo if s.python == version)
            index = next((i for i, t in enumerate(matrix.torch) if t.python == version), None)
            key = f"torch[{index}].python" if index is not None else "install.python"
            problems[(key, version)] = (f"{config}: key '{key}': expected a Python that uv can provide "
                                        f"(got {version!r} for {spec.name}): {py_checks[version]}")
        specs = [s for s in todo if s.python not in bad_python]
        for bad in pool.map(resolve_spec, specs):
            if bad is None:
                continue
            key = _config_key(matrix, bad.spec, bad.package, torch_key)
            what = f"{bad.package} as requested" if bad.package else "its packages"
            where = key if key.startswith("--") else f"{config}: key '{key}'"
            problems.setdefault((key, bad.message), (
                f"{where}: expected installable packages; environment {bad.spec.name} "
                f"(torch {bad.spec.torch}, python {bad.spec.python}) cannot install {what}: {bad.message}"))
    if problems:
        raise ConfigError("\n".join(problems.values()))


def unresolvable_releases(matrix: Matrix, config: Path, jobs: int = 4) -> dict[tuple[str, str], str]:
    """The runtime releases ``runtime_versions``, ``runtime_floor`` and ``deploy`` name that the
    package index cannot install (their runtime-only environments resolved like the torch ones,
    each release once however many keys name it): (key, message) → one line naming file and key.
    A release that cannot be installed would otherwise be found only after the whole run."""
    from harness.envs.runtime_only import RuntimeRelease
    from harness.envs.venv import VenvProvider

    keys: dict[RuntimeRelease, list[str]] = {}
    for field in ("runtime_versions", "runtime_floor", "deploy"):
        for runtime, given in (getattr(matrix, field, None) or {}).items():
            versions = given if isinstance(given, list) else [given]
            for i, version in enumerate(versions):
                where = f"{field}.{runtime}" + (f"[{i}]" if isinstance(given, list) else "")
                keys.setdefault(RuntimeRelease(runtime, version), []).append(where)
    python = getattr(matrix.install, "python", None) or "3.11"
    provider = VenvProvider(log=lambda *a, **k: None)
    specs = {rel: rel.spec(python, matrix.install) for rel in keys}
    todo = [rel for rel, spec in specs.items() if not provider.is_ready(spec)]
    problems: dict[tuple[str, str], str] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for rel, bad in zip(todo, pool.map(resolve_spec, [specs[r] for r in todo])):
            if bad is None:
                continue
            named = "', '".join(keys[rel])
            problems[(keys[rel][0], bad.message)] = (
                f"{config}: key '{named}': expected a release of {rel.package} that the package index has; "
                f"{rel.package}=={rel.version} (runtime-only environment, python {python}) cannot be "
                f"installed: {bad.message}")
    return problems
