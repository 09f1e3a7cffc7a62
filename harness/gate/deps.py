"""The gate's two sides from a repository's dependency files: the target branch against the
pull request (``gate --from-deps BASE_REF``).

The baseline is the torch release the dependency files pin at ``BASE_REF`` (``git show
BASE_REF:path``), the candidate the one the working tree pins; the companion packages pinned
beside it (torchvision, numpy, onnx, transformers, ...) come along on each side. The matrix the
gate then plans is the user's matrix file with its ``torch`` list replaced by those two entries
(written into the gate's folder, case paths made absolute), so the rest of the gate is the
ordinary one: the job summary, the JUnit report and the exit code as for ``--baseline V
--candidate V``.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.matrix.config import COMPANIONS, read_config, shipped_matrix
from harness.matrix.deps import Pins, find_files, public, read_pins, working_tree_reader
from harness.matrix.pins import decode, platform
from harness.matrix.rules import ConfigError

# Companion packages (``COMPANIONS``) are torch-entry keys of the matrix file; the others become
# extras. Runtime packages: their version is the runtime's, not the torch entry's (kept as information).
RUNTIME_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "openvino")


@dataclass
class DepsSides:
    baseline: Pins
    candidate: Pins
    base_ref: str

    @property
    def bump(self) -> bool:
        return public(self.baseline.torch or "") != public(self.candidate.torch or "")

    def describe(self) -> str:
        def side(p: Pins) -> str:
            extra = ", ".join(f"{k} {v}" for k, v in sorted(p.companions().items()))
            return f"torch {p.torch} ({p.lines.get('torch')})" + (f" with {extra}" if extra else "")
        return f"baseline {self.base_ref}: {side(self.baseline)}; candidate: {side(self.candidate)}"


def _git(*args: str, cwd: Path, text: bool = True) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=text)
    except FileNotFoundError:
        raise ConfigError("--from-deps: git is not installed; expected a git checkout") from None


def base_reader(base_ref: str, root: Path):
    """Read a file as it is at ``base_ref`` (None where it does not exist there)."""
    proc = _git("rev-parse", "--verify", "--quiet", f"{base_ref}^{{commit}}", cwd=root)
    if proc.returncode != 0:
        raise ConfigError(f"--from-deps {base_ref}: not a commit of this repository "
                          "(fetch the target branch: actions/checkout with fetch-depth: 0)")

    def read(path: str) -> str | None:
        shown = _git("show", f"{base_ref}:./{path}", cwd=root, text=False)
        return decode(shown.stdout, f"{base_ref}:{path}") if shown.returncode == 0 else None
    return read


def _base_files(base_ref: str, root: Path) -> list[str]:
    """The dependency files at ``base_ref`` (paths relative to ``root``), in reading order."""
    import fnmatch

    from harness.matrix.deps import PATTERNS

    listed = _git("ls-tree", "-r", "--name-only", base_ref, "--", ".", cwd=root)
    names = sorted(listed.stdout.splitlines()) if listed.returncode == 0 else []
    return list(dict.fromkeys(n for pattern in PATTERNS for n in names
                              if fnmatch.fnmatch(n, pattern) and n.count("/") == pattern.count("/")))


def read_sides(base_ref: str, root: Path) -> DepsSides:
    """Pins at ``base_ref`` and in the working tree of the repository at ``root``."""
    reader = base_reader(base_ref, root)
    candidate = read_pins(find_files(root), working_tree_reader(root))
    baseline = read_pins(_base_files(base_ref, root), reader)
    for name, pins, where in (("candidate", candidate, "the working tree"), ("baseline", baseline, base_ref)):
        if not pins.torch:
            looked = ", ".join(pins.files) or "no dependency file found"
            elsewhere = (f"; torch is pinned only for other platforms than this one ({platform()}): "
                         + ", ".join(pins.other_platforms)) if pins.other_platforms else ""
            raise ConfigError(f"--from-deps: the {name} ({where}) pins no torch release "
                              f"(read: {looked}){elsewhere}; expected torch==VERSION in requirements*.txt, "
                              "pyproject.toml, uv.lock, poetry.lock or Pipfile.lock")
    return DepsSides(baseline, candidate, base_ref)


def _torch_entry(pins: Pins, existing: dict[str, Any] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {k: v for k, v in (existing or {}).items() if k != "version"}
    entry["version"] = public(pins.torch or "")
    extras = [e for e in entry.get("extras", []) if not any(
        e.replace("_", "-").lower().startswith(n) for n in pins.companions())]
    for name, version in sorted(pins.companions().items()):
        if name in COMPANIONS:
            entry[name] = public(version)
        elif name not in RUNTIME_PACKAGES:
            extras.append(f"{name}=={public(version)}")
    if extras:
        entry["extras"] = extras
    return entry


def _absolute_cases(data: dict[str, Any], base: Path) -> None:
    def fix(target: Any) -> Any:
        if isinstance(target, str) and ".py:" in target and not Path(target.split(":")[0]).is_absolute():
            return str(base / target)
        return target
    cases = data.get("cases")
    if isinstance(cases, list):
        data["cases"] = [({**c, "target": fix(c.get("target"))} if isinstance(c, dict) else fix(c))
                         for c in cases]
    for inc in data.get("include") or []:
        if isinstance(inc, dict) and "case" in inc:
            inc["case"] = fix(inc["case"])


def gate_matrix(sides: DepsSides, config: Path, folder: Path) -> Path:
    """The user's matrix with ``torch`` replaced by the two sides' entries, written into ``folder``."""
    config = shipped_matrix(config)
    data = read_config(config)
    if not isinstance(data, dict):
        raise ConfigError(f"{config}: key '<top>': expected a mapping with keys torch, exporters, "
                          "opsets, cases")
    listed = data.get("torch") or []
    listed = listed if isinstance(listed, list) else [listed]
    by_version = {str(e.get("version") if isinstance(e, dict) else e): e for e in listed}

    def existing(version: str) -> dict[str, Any] | None:
        entry = by_version.get(version)
        return entry if isinstance(entry, dict) else None

    base_v, cand_v = public(sides.baseline.torch or ""), public(sides.candidate.torch or "")
    data["torch"] = [_torch_entry(sides.baseline, existing(base_v)),
                     _torch_entry(sides.candidate, existing(cand_v))]
    _absolute_cases(data, config.resolve().parent)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "matrix.from-deps.yaml"
    out.write_text(f"# {config.name} with torch from the dependency files: {sides.describe()}\n"
                   + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out
