"""Pins as the dependency files state them: one package's exact release, where it is written,
whether its environment markers hold on the platform the command runs on.

The primitives of ``harness.matrix.deps`` (which reads each file format): markers evaluated with
``packaging.markers`` for this platform, a release read from a wheel or sdist URL's file name,
one pin per package per file (two releases for one platform are an error naming both), and text
that is not UTF-8 refused with its file and line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote, urlparse

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName, default_environment
from packaging.requirements import Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from harness.matrix.rules import ConfigError

# What a torch bump usually moves with it; each is carried into the gate's matrix when pinned.
# (A wider list than matrix.config.COMPANIONS, the companions a torch entry pins by a field.)
MOVES_WITH_TORCH = ("torchvision", "torchaudio", "numpy", "onnx", "onnxscript", "protobuf", "transformers",
                    "timm", "optimum", "optimum-onnx", "onnxruntime", "onnxruntime-gpu", "openvino")
# Packages whose pin must be read whatever form it takes: a URL with no release in it is refused.
REQUIRED = ("torch",)


@dataclass(frozen=True)
class Pin:
    """One exact pin that applies on this platform: the package (canonical name), its version and
    where it is written (``requirements.txt:3``; a section for Pipfile.lock)."""

    name: str
    version: str
    file: str
    line: int | None = None
    section: str | None = None

    @property
    def where(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where} ({self.section})" if self.section else where


@dataclass
class Pins:
    """Exact versions per package (canonical names), each with the file and line that pins it."""

    versions: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)     # package -> file
    lines: dict[str, str] = field(default_factory=dict)       # package -> file:line
    files: list[str] = field(default_factory=list)
    other_platforms: list[str] = field(default_factory=list)  # torch lines whose markers exclude us

    @property
    def torch(self) -> str | None:
        return self.versions.get("torch")

    def companions(self) -> dict[str, str]:
        return {k: v for k, v in self.versions.items() if k in MOVES_WITH_TORCH}


def public(version: str) -> str:
    """``2.6.0+cpu`` -> ``2.6.0``: the release; the local label names a build (CPU, CUDA)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def platform() -> str:
    """This platform as markers see it (what the pins are read for)."""
    env = default_environment()
    return f"{env['sys_platform']} {env['platform_machine']}, Python {env['python_full_version']}"


def applies(marker: Marker | str | None, where: str, extra: str = "") -> bool:
    """Whether an environment marker holds on this platform (``extra``: the group being read)."""
    if marker is None or marker == "":
        return True
    try:
        marker = marker if isinstance(marker, Marker) else Marker(marker)
        return marker.evaluate({"extra": extra})
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName) as exc:
        raise ConfigError(f"{where}: marker {str(marker)!r} cannot be evaluated ({exc}); expected "
                          "an environment marker such as sys_platform == \"linux\"") from None


def decode(data: bytes, where: str) -> str:
    """UTF-8 text of a dependency file; otherwise an error naming the file, line and byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{where}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x}); expected a UTF-8 "
                          "text file") from None


def line_of(text: str, needle: str | re.Pattern[str], after: int = 0) -> int | None:
    """The number of the first line after line ``after`` that holds ``needle`` (a string, or a
    pattern it matches); None: none."""
    for number, line in enumerate(text.splitlines()[after:], after + 1):
        if (needle in line) if isinstance(needle, str) else needle.match(line):
            return number
    return None


def single(pins: Iterable[Pin], kind: str = "pins") -> dict[str, Pin]:
    """One pin per package: the same release twice is one pin; two releases are an error naming
    both places (the markers of both hold on this platform)."""
    out: dict[str, Pin] = {}
    for pin in pins:
        first = out.get(pin.name)
        if first is None:
            out[pin.name] = pin
        elif public(first.version) != public(pin.version):
            raise ConfigError(f"{pin.where}: {kind} {pin.name} {pin.version}, but {first.where} "
                              f"{kind} {pin.name} {first.version}, both for this platform ({platform()}); "
                              "expected one release per package (environment markers tell platforms apart)")
    return out


def _exact(req: Requirement) -> str | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def url_release(url: str) -> tuple[str, str] | None:
    """(package, release) a wheel or sdist URL names (``torch-2.13.0%2Bcpu-cp311-...whl`` ->
    torch, 2.13.0+cpu); None for any other URL (a git repository, a folder)."""
    filename = unquote(Path(urlparse(url).path).name)
    try:
        if filename.endswith(".whl"):
            name, version, *_ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return canonicalize_name(name), str(version)


def requirement_pin(req: Requirement, file: str, line: int | None, extra: str = "") -> Pin | None:
    """The pin a requirement makes on this platform (None: a range, or its markers exclude us)."""
    where = f"{file}:{line}" if line else file
    if req.marker is not None and not applies(req.marker, where, extra):
        return None
    name = canonicalize_name(req.name)
    version = _exact(req)
    if req.url:
        named = url_release(req.url)
        version = named[1] if named and named[0] == name else None
        if version is None and name in REQUIRED:
            raise ConfigError(f"{where}: {req.name} @ {req.url}: no release can be read from this URL; "
                              f"expected {req.name}==VERSION or a wheel URL (name-VERSION-...whl)")
    return Pin(name, version, file, line) if version is not None else None
