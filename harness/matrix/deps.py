"""The torch pin (and its companions') in a repository's own dependency files.

Read, never installed: ``requirements*.txt`` (also ``requirements/*.txt`` and files they include
with ``-r``), ``pyproject.toml`` (``[project] dependencies``, optional dependencies, dependency
groups, ``[tool.poetry]`` dependencies), ``uv.lock``, ``poetry.lock`` and ``Pipfile.lock``.
Requirements are parsed with ``packaging``, TOML with ``tomllib``, the Pipfile lock as JSON.

Only exact pins count (``torch==2.6.0``, a lock's version): a range (``torch>=2.6``) says which
releases are allowed, not which one ships. A lock file states what is installed, so where one
pins a package, the other files' pins of it are not consulted; two files of the same kind that
pin different versions are an error naming both.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.matrix.rules import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# What a torch bump usually moves with it; each is carried into the gate's matrix when pinned.
COMPANIONS = ("torchvision", "torchaudio", "numpy", "onnx", "onnxscript", "protobuf", "transformers",
              "timm", "optimum", "optimum-onnx", "onnxruntime", "onnxruntime-gpu", "openvino")
LOCKS = ("uv.lock", "poetry.lock", "Pipfile.lock")
# (file name pattern, relative folder) of the files read, in the order they are looked for.
PATTERNS = ("uv.lock", "poetry.lock", "Pipfile.lock", "requirements*.txt", "requirements/*.txt",
            "pyproject.toml")

Reader = Callable[[str], str | None]   # path relative to the repository -> its text, or None


@dataclass
class Pins:
    """Exact versions per package (canonical names), each with the file that pins it."""

    versions: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def torch(self) -> str | None:
        return self.versions.get("torch")

    def companions(self) -> dict[str, str]:
        return {k: v for k, v in self.versions.items() if k in COMPANIONS}


def public(version: str) -> str:
    """``2.6.0+cpu`` -> ``2.6.0``: the release; the local label names a build (CPU, CUDA)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def _exact(req: Requirement) -> str | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def _requirement_lines(text: str) -> Iterable[tuple[int, str]]:
    """Logical lines of a requirements file: continuations joined, comments and options cut
    (``--hash`` lines of pip-compile output stay with their requirement)."""
    joined, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not joined:
            start = number
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        if joined.strip():
            yield start, joined.strip()
        joined = ""
    if joined.strip():
        yield start, joined.strip()


def parse_requirements(text: str, where: str, read: Reader | None = None, seen: set[str] | None = None,
                       sources: dict[str, str] | None = None) -> dict[str, str]:
    """Exact pins of a requirements file (and of the files it includes with ``-r``); ``sources``,
    when given, gets the file each pin is written in."""
    out: dict[str, str] = {}
    sources = sources if sources is not None else {}
    seen = seen if seen is not None else {where}
    for number, line in _requirement_lines(text):
        if m := re.match(r"^(?:-r|--requirement)[\s=]+(\S+)", line):
            include = str(Path(where).parent / m.group(1))
            if read is not None and include not in seen:
                seen.add(include)
                body = read(include)
                if body is None:
                    raise ConfigError(f"{where}:{number}: includes {m.group(1)}, which does not exist")
                out.update(parse_requirements(body, include, read, seen, sources))
            continue
        if line.startswith("-"):
            continue   # --index-url, -c constraints, -e paths: not pins of a release
        line = re.split(r"\s+--hash[=\s]", line)[0]
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            if "://" in line or line.startswith((".", "/")):
                continue   # a URL or a local path: no release to read
            raise ConfigError(f"{where}:{number}: expected a requirement such as 'torch==2.6.0' "
                              f"({exc})") from None
        if (version := _exact(req)) is not None:
            out[canonicalize_name(req.name)] = version
            sources[canonicalize_name(req.name)] = where
    return out


def _toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None


def _poetry_version(spec: object) -> str | None:
    """A Poetry constraint that is one release: ``"2.6.0"`` or ``"==2.6.0"`` (``^``/``~`` are ranges)."""
    if isinstance(spec, dict):
        spec = spec.get("version")
    if not isinstance(spec, str):
        return None
    spec = spec.strip().removeprefix("==").strip()
    try:
        Version(spec)
    except InvalidVersion:
        return None
    return spec


def parse_pyproject(text: str, where: str) -> dict[str, str]:
    data = _toml(text, where)
    project = data.get("project", {})
    lines = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        lines += group
    for group in data.get("dependency-groups", {}).values():
        lines += [x for x in group if isinstance(x, str)]
    out: dict[str, str] = {}
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise ConfigError(f"{where}: dependency {line!r}: expected a requirement such as "
                              "'torch==2.6.0'") from None
        if (version := _exact(req)) is not None:
            out[canonicalize_name(req.name)] = version
    poetry = data.get("tool", {}).get("poetry", {})
    tables = [poetry.get("dependencies", {}), poetry.get("dev-dependencies", {})]
    tables += [g.get("dependencies", {}) for g in poetry.get("group", {}).values()]
    for table in tables:
        for name, spec in table.items():
            if name.lower() != "python" and (version := _poetry_version(spec)) is not None:
                out[canonicalize_name(name)] = version
    return out


def parse_lock(text: str, where: str) -> dict[str, str]:
    """uv.lock and poetry.lock: ``[[package]]`` tables with ``name`` and ``version``. A package
    locked at several versions (per platform or source) must agree on its release."""
    out: dict[str, str] = {}
    for pkg in _toml(text, where).get("package", []):
        name, version = pkg.get("name"), pkg.get("version")
        if not isinstance(name, str) or not isinstance(version, str):
            continue
        name = canonicalize_name(name)
        if name in out and public(out[name]) != public(version):
            raise ConfigError(f"{where}: {name} is locked at {out[name]} and at {version}; "
                              "expected one release per package")
        out.setdefault(name, version)
    return out


def parse_pipfile_lock(text: str, where: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    out: dict[str, str] = {}
    for section in ("default", "develop"):
        for name, spec in (data.get(section) or {}).items():
            version = spec.get("version", "") if isinstance(spec, dict) else ""
            if version.startswith("=="):
                out.setdefault(canonicalize_name(name), version[2:])
    return out


def _parser(path: str) -> str:
    name = Path(path).name
    if name in ("uv.lock", "poetry.lock"):
        return "lock"
    if name == "Pipfile.lock":
        return "pipfile"
    if name == "pyproject.toml":
        return "pyproject"
    return "requirements"


def find_files(root: Path) -> list[str]:
    """Dependency files of a repository (paths relative to ``root``), in reading order."""
    found: list[str] = []
    for pattern in PATTERNS:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and rel not in found:
                found.append(rel)
    return found


def read_pins(files: Iterable[str], read: Reader) -> Pins:
    """The exact pins of ``files`` (read through ``read``; a file it cannot read is left out)."""
    by_kind: dict[str, list[tuple[str, dict[str, str]]]] = {"lock": [], "other": []}
    written_in: dict[tuple[str, str], str] = {}   # (file read, package) -> file with the line
    pins = Pins()
    for path in files:
        text = read(path)
        if text is None:
            continue
        kind = _parser(path)
        found: dict[str, str] = {}
        parsed = {"lock": parse_lock, "pipfile": parse_pipfile_lock, "pyproject": parse_pyproject}.get(
            kind, lambda t, w: parse_requirements(t, w, read, sources=found))(text, path)
        written_in.update({(path, name): found.get(name, path) for name in parsed})
        pins.files.append(path)
        by_kind["lock" if kind in ("lock", "pipfile") else "other"].append((path, parsed))
    kind_of: dict[str, str] = {}
    for kind in ("lock", "other"):
        for path, parsed in by_kind[kind]:
            for name, version in parsed.items():
                if kind_of.get(name, kind) != kind:
                    continue   # a lock pins it: what is installed
                if name in pins.versions:
                    if public(pins.versions[name]) != public(version):
                        raise ConfigError(f"{written_in[(path, name)]}: pins {name}=={version}, but "
                                          f"{pins.sources[name]} pins {name}=={pins.versions[name]}; "
                                          "expected one version")
                    continue
                pins.versions[name], pins.sources[name] = version, written_in[(path, name)]
                kind_of[name] = kind
    return pins


def working_tree_reader(root: Path) -> Reader:
    def read(path: str) -> str | None:
        try:
            return (root / path).read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
    return read
