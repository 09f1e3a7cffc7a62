"""The torch pin (and its companions') in a repository's own dependency files.

Read, never installed: ``requirements*.txt`` (also ``requirements/*.txt`` and files they include
with ``-r``), ``pyproject.toml`` (``[project] dependencies``, optional dependencies, dependency
groups, ``[tool.poetry]`` dependencies), ``uv.lock``, ``poetry.lock`` and ``Pipfile.lock``.
Requirements and markers are read with ``packaging`` (``harness.matrix.pins``), TOML with
``tomllib``, the Pipfile lock as JSON.

Only exact pins count (``torch==2.6.0``, a lock's version, a wheel URL's file name): a range
(``torch>=2.6``) says which releases are allowed, not which one ships. Environment markers are
evaluated for the platform the command runs on (``torch==2.2.2; sys_platform == "darwin"`` is
not a Linux pin). One file pinning a package at two releases for this platform (two lines,
Pipfile.lock's ``default`` and ``develop``) is an error naming both, and so is a torch URL whose
release cannot be read. A lock file states what is installed, so where one pins a package, the
other files' pins of it are not consulted; two files of the same kind that pin different
versions are an error naming both. A file that is not what its name says (TOML, JSON, UTF-8, the
tables a lock has) is an error naming it.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.matrix.pins import (
    Pin,
    Pins,
    applies,
    decode,
    line_of,
    public,
    requirement_pin,
    single,
    url_release,
)
from harness.matrix.rules import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LOCKS = ("uv.lock", "poetry.lock", "Pipfile.lock")
# (file name pattern, relative folder) of the files read, in the order they are looked for.
PATTERNS = ("uv.lock", "poetry.lock", "Pipfile.lock", "requirements*.txt", "requirements/*.txt",
            "pyproject.toml")
_OPTIONS = re.compile(r"\s+--?[A-Za-z]")   # per-requirement options: --hash, --config-settings

Reader = Callable[[str], str | None]   # path relative to the repository -> its text, or None


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


def requirements_pins(text: str, where: str, read: Reader | None = None,
                      seen: set[str] | None = None) -> list[Pin]:
    """The pins of a requirements file on this platform, in order, with those of the files it
    includes with ``-r`` (each pin names its own file and line)."""
    out: list[Pin] = []
    seen = seen if seen is not None else {where}
    for number, line in _requirement_lines(text):
        if m := re.match(r"^(?:-r|--requirement)[\s=]+(\S+)", line):
            include = str(Path(where).parent / m.group(1))
            if read is not None and include not in seen:
                seen.add(include)
                body = read(include)
                if body is None:
                    raise ConfigError(f"{where}:{number}: includes {m.group(1)}, which does not exist")
                out += requirements_pins(body, include, read, seen)
            continue
        if line.startswith("-"):
            continue   # --index-url, -c constraints, -e paths: not pins of a release
        line = _OPTIONS.split(line)[0]
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            if "://" in line or line.startswith((".", "/")):
                # A bare URL or path: a wheel's file name still names its package and release
                # (markers after " ; " as pip reads them).
                url, _, marker = (part.strip() for part in line.partition(" ;"))
                if "://" in url and (named := url_release(url)) is not None \
                        and applies(marker or None, f"{where}:{number}"):
                    out.append(Pin(named[0], named[1], where, number))
                continue
            raise ConfigError(f"{where}:{number}: expected a requirement such as 'torch==2.6.0' "
                              f"({exc})") from None
        if (pin := requirement_pin(req, where, number)) is not None:
            out.append(pin)
    return out


def parse_requirements(text: str, where: str, read: Reader | None = None) -> dict[str, str]:
    """Exact pins of a requirements file on this platform (and of the files it includes)."""
    return {n: p.version for n, p in single(requirements_pins(text, where, read)).items()}


def _toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None


def _get(data: Any, path: str, where: str, kind: type = dict) -> Any:
    """The value at a dotted ``path`` when it is a ``kind`` (missing: an empty one), else an
    error naming the key (a table on the way that is not one included)."""
    value: Any = data
    keys = path.split(".")
    for i, key in enumerate(keys):
        value = value.get(key)
        if value is None:
            return kind()
        want = kind if i == len(keys) - 1 else dict
        if not isinstance(value, want):
            raise ConfigError(f"{where}: key '{'.'.join(keys[:i + 1])}': expected a "
                              f"{'table' if want is dict else 'list'} (got {type(value).__name__})")
    return value


def _poetry_pins(name: str, spec: Any, where: str, text: str) -> list[Pin]:
    """A Poetry constraint that is one release: ``"2.6.0"``, ``"==2.6.0"``, ``{version = ...}``;
    a list of them is one per platform (``markers``, ``platform``): those that apply here."""
    out = []
    for item in spec if isinstance(spec, list) else [spec]:
        if isinstance(item, dict):
            marker = item.get("markers")
            if isinstance(item.get("platform"), str):
                marker = f"sys_platform == {item['platform']!r}" + (f" and ({marker})" if marker else "")
            if isinstance(marker, str) and not applies(marker, f"{where}: {name}"):
                continue
            item = item.get("version")
        if not isinstance(item, str):
            continue
        item = item.strip().removeprefix("==").strip()
        try:
            Version(item)
        except InvalidVersion:
            continue
        key = re.compile(rf'^\s*["\']?{re.escape(name)}["\']?\s*=', re.IGNORECASE)
        out.append(Pin(canonicalize_name(name), item, where, line_of(text, key)))
    return out


def pyproject_pins(text: str, where: str) -> list[Pin]:
    """``==`` pins of ``[project]`` dependencies (optional ones under their extra's name for
    markers), dependency groups, and ``[tool.poetry]`` dependency tables, on this platform."""
    data = _toml(text, where)
    lines: list[tuple[str, str]] = [(x, "") for x in _get(data, "project.dependencies", where, list)]
    for extra in _get(data, "project.optional-dependencies", where):
        lines += [(x, extra) for x in _get(data, f"project.optional-dependencies.{extra}", where, list)]
    for name in _get(data, "dependency-groups", where):
        lines += [(x, "") for x in _get(data, f"dependency-groups.{name}", where, list) if not isinstance(x, dict)]
    out: list[Pin] = []
    for line, extra in lines:
        number = line_of(text, line) if isinstance(line, str) else None
        try:
            req = Requirement(line)
        except (InvalidRequirement, TypeError):
            raise ConfigError(f"{where}{f':{number}' if number else ''}: dependency {line!r}: expected a "
                              "requirement such as 'torch==2.6.0'") from None
        if (pin := requirement_pin(req, where, number, extra)) is not None:
            out.append(pin)
    poetry = _get(data, "tool.poetry", where)
    tables = [_get(poetry, "dependencies", where), _get(poetry, "dev-dependencies", where)]
    tables += [_get(poetry, f"group.{g}.dependencies", where) for g in _get(poetry, "group", where)]
    for table in tables:
        for name, spec in table.items():
            if name.lower() != "python":
                out += _poetry_pins(name, spec, where, text)
    return out


def parse_pyproject(text: str, where: str) -> dict[str, str]:
    return {n: p.version for n, p in single(pyproject_pins(text, where)).items()}


def lock_pins(text: str, where: str) -> list[Pin]:
    """uv.lock and poetry.lock: ``[[package]]`` tables with ``name`` and ``version``. A package
    locked per platform (``resolution-markers`` in uv.lock, ``markers`` in poetry.lock) counts
    where its markers hold here; when none holds (markers of extras), every entry must agree."""
    packages = _get(_toml(text, where), "package", where, list)
    headers = [i for i, line in enumerate(text.splitlines(), 1) if line.strip() == "[[package]]"]
    entries: dict[str, list[tuple[Pin, bool]]] = {}
    for i, pkg in enumerate(packages):
        line = headers[i] if len(headers) == len(packages) else None
        if not isinstance(pkg, dict):
            raise ConfigError(f"{where}{f':{line}' if line else ''}: key 'package[{i}]': expected a "
                              f"[[package]] table (got {type(pkg).__name__})")
        name, version = pkg.get("name"), pkg.get("version")
        if not isinstance(name, str) or not isinstance(version, str):
            continue   # the project itself (editable, virtual) has no release
        markers = pkg.get("resolution-markers", pkg.get("markers"))
        markers = [markers] if isinstance(markers, str) else markers if isinstance(markers, list) else []
        here = not markers or any(applies(m, f"{where}:{line or '?'}", "") for m in markers if isinstance(m, str))
        entries.setdefault(canonicalize_name(name), []).append(
            (Pin(canonicalize_name(name), version, where, line), here))
    out = []
    for found in entries.values():
        out += [p for p, here in found if here] or [p for p, _ in found]
    return out


def parse_lock(text: str, where: str) -> dict[str, str]:
    return {n: p.version for n, p in single(lock_pins(text, where), "locks").items()}


def pipfile_pins(text: str, where: str) -> list[Pin]:
    """Pipfile.lock's ``default`` and ``develop`` sections: ``"version": "==X"`` (or a wheel
    ``file``), where its ``markers`` hold here."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object with 'default' and 'develop'")
    out: list[Pin] = []
    for section in ("default", "develop"):
        start = line_of(text, f'"{section}"') or 0
        for name, spec in _get(data, section, where).items():
            if not isinstance(spec, dict):
                continue
            line = line_of(text, f'"{name}"', start)
            if isinstance(spec.get("markers"), str) and not applies(spec["markers"], f"{where}:{line}"):
                continue
            version = spec.get("version")
            if isinstance(version, str) and version.startswith(("==", "===")):
                pin = Pin(canonicalize_name(name), version.lstrip("="), where, line, section)
            elif isinstance(spec.get("file"), str) and (named := url_release(spec["file"])):
                pin = Pin(named[0], named[1], where, line, section)
            else:
                continue
            out.append(pin)
    return out


def parse_pipfile_lock(text: str, where: str) -> dict[str, str]:
    return {n: p.version for n, p in single(pipfile_pins(text, where), "locks").items()}


def _kind(path: str) -> str:
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


def _torch_elsewhere(text: str, path: str) -> list[str]:
    """Lines of a requirements file that pin torch for another platform (named when no pin
    applies here)."""
    out = []
    for number, line in _requirement_lines(text):
        try:
            req = Requirement(_OPTIONS.split(line)[0])
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch" and req.marker is not None and not applies(req.marker, path):
            out.append(f"{path}:{number} ({req.marker})")
    return out


def read_pins(files: Iterable[str], read: Reader) -> Pins:
    """The exact pins of ``files`` on this platform (read through ``read``; a file it cannot
    read is left out)."""
    readers = {"lock": lambda t, w: single(lock_pins(t, w), "locks"),
               "pipfile": lambda t, w: single(pipfile_pins(t, w), "locks"),
               "pyproject": lambda t, w: single(pyproject_pins(t, w)),
               "requirements": lambda t, w: single(requirements_pins(t, w, read))}
    by_kind: dict[str, list[dict[str, Pin]]] = {"lock": [], "other": []}
    pins = Pins()
    for path in files:
        text = read(path)
        if text is None:
            continue
        kind = _kind(path)
        by_kind["lock" if kind in ("lock", "pipfile") else "other"].append(readers[kind](text, path))
        pins.files.append(path)
        if kind == "requirements":
            pins.other_platforms += _torch_elsewhere(text, path)
    kind_of: dict[str, str] = {}
    chosen: dict[str, Pin] = {}
    for kind in ("lock", "other"):
        for found in by_kind[kind]:
            for name, pin in found.items():
                if kind_of.get(name, kind) != kind:
                    continue   # a lock pins it: what is installed
                if name in chosen:
                    if public(chosen[name].version) != public(pin.version):
                        raise ConfigError(f"{pin.where}: pins {name}=={pin.version}, but {chosen[name].where} "
                                          f"pins {name}=={chosen[name].version}; expected one version")
                    continue
                chosen[name], kind_of[name] = pin, kind
    for name, pin in chosen.items():
        pins.versions[name], pins.sources[name], pins.lines[name] = pin.version, pin.file, pin.where
    return pins


def working_tree_reader(root: Path) -> Reader:
    def read(path: str) -> str | None:
        try:
            return decode((root / path).read_bytes(), path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return read
