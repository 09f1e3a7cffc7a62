"""matrix.yaml: schema, loading and validation with errors that name file, key and expectation."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union
from urllib.parse import urlsplit

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.core.cell import AXES, DIM_POLICIES, EXPORTERS, PRECISIONS, CaseRef
from harness.core.job import LatencyProtocol
from harness.matrix.rules import ConfigError
from harness.probes import GROUPS, PROBES
from harness.runtimes import RUNTIMES

Scalar = Union[str, int, float, bool]
LOG_MAX_MB = 20


def _check_opset(v: int) -> int:
    if not 7 <= v <= 26:
        raise ValueError("expected an ONNX opset between 7 and 26")
    return v


Opset = Annotated[int, AfterValidator(_check_opset)]


def _check_axes(rule: dict) -> dict:
    unknown = [k for k in rule if k not in AXES]
    if unknown:
        raise ValueError(f"unknown axis {unknown[0]!r}; expected keys among {list(AXES)}")
    if not rule:
        raise ValueError(f"expected at least one axis among {list(AXES)} (an empty rule matches every cell)")
    for key, want in rule.items():
        for v in want if isinstance(want, list) else [want]:
            if isinstance(v, str) and v.startswith("~"):
                try:
                    re.compile(v[1:])
                except re.error as exc:
                    raise ValueError(f"{key}: {v!r} is not a valid regular expression ({exc})") from None
    return rule


Rule = Annotated[dict[str, Union[Scalar, list[Scalar]]], AfterValidator(_check_axes)]


def _check_version(v: str, what: str = "a release version such as '2.13.0'") -> str:
    """A plain release version (PEP 440): never a path, URL or requirement."""
    try:
        Version(v)
    except InvalidVersion:
        raise ValueError(f"expected {what}") from None
    return v


def _check_pin(v: str) -> str:
    """A companion pin: a version ('2.3.5') or a version specifier ('<2.3', '>=1.26,<2')."""
    try:
        Version(v)
        return v
    except InvalidVersion:
        pass
    try:
        if v.strip() and v.strip()[0] in "<>=!~":
            SpecifierSet(v)
            return v
    except InvalidSpecifier:
        pass
    raise ValueError("expected a version such as '2.3.5' or a specifier such as '<2.3'")


def _check_python(v: str) -> str:
    """A CPython version uv can be asked for: '3.11' or '3.11.7', 3.9 or newer."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", v) or Version(v) < Version("3.9") or Version(v).major != 3:
        raise ValueError("expected a Python version 3.9 or newer such as '3.11'")
    return v


def _check_url(v: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    parts = urlsplit(v)
    if parts.scheme not in schemes or (parts.scheme != "file" and not parts.netloc) or any(c.isspace() for c in v):
        raise ValueError(f"expected an {'/'.join(schemes)} URL")
    return v


def _check_case_target(v: str) -> str:
    """A built-in probe name, 'file.py:function' or 'package.module:function'."""
    if v in PROBES:
        return v
    ref = CaseRef.try_parse(v)
    if ref is None:
        if ":" not in v:
            raise ValueError(f"unknown probe {v!r}; expected a built-in probe ({', '.join(PROBES)}), a group "
                             f"({', '.join(GROUPS)}), 'file.py:function' or 'package.module:function'")
        raise ValueError("expected 'file.py:function' or 'package.module:function'")
    if not ref.is_file and not all(part.isidentifier() for part in ref.target.split(".")):
        raise ValueError(f"{ref.target!r} is neither a .py file nor an importable module name")
    return v


def _check_requirement(v: str) -> str:
    try:
        Requirement(v)
    except InvalidRequirement:
        raise ValueError("expected a requirement such as 'transformers==4.57.1'") from None
    return v


Version_ = Annotated[str, AfterValidator(_check_version)]
Pin = Annotated[str, AfterValidator(_check_pin)]
PythonVersion = Annotated[str, AfterValidator(_check_python)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TorchSpec(_Strict):
    version: str
    python: PythonVersion | None = None
    numpy: Pin | None = None
    onnx: Pin | None = None
    onnxscript: Pin | None = None
    protobuf: Pin | None = None
    extras: list[Annotated[str, AfterValidator(_check_requirement)]] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        return _check_version(v, "a torch release such as '2.13.0'")


class RuntimeSpec(_Strict):
    name: str
    version: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in RUNTIMES:
            raise ValueError(f"expected one of {sorted(RUNTIMES)}")
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        return None if v is None else _check_version(v, "a release of the runtime's package such as '1.32.0'")

    @property
    def label(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


Tolerance = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class CaseEntry(_Strict):
    target: Annotated[str, AfterValidator(_check_case_target)]
    name: str | None = Field(None, min_length=1)
    atol: Tolerance | None = None
    rtol: Tolerance | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        ref = CaseRef.try_parse(self.target)
        return ref.function if ref else self.target


class XfailEntry(_Strict):
    match: dict[str, Scalar | list[Scalar]]
    reason: str = Field(min_length=3)
    link: Annotated[str, AfterValidator(_check_url)]

    @field_validator("match")
    @classmethod
    def _axes(cls, v: dict) -> dict:
        return _check_axes(v)


class IncludeEntry(_Strict):
    """One extra cell, its axes validated like the main lists; unset axes take the first value
    of each list (the matrix checks that runtime and case name one it knows)."""

    torch: Version_ | None = None
    exporter: Literal[EXPORTERS] | None = None
    opset: Opset | None = None
    runtime: str | None = None
    case: str | None = None
    constant_folding: bool | None = None
    dynamic: bool | None = None
    precision: Literal[PRECISIONS] | None = None
    dim_policy: Literal[DIM_POLICIES] | None = None

    @model_serializer(mode="wrap")
    def _set_axes_only(self, handler: Any) -> dict[str, Any]:
        # Serialised as the rule it was written as: the matrix hash of a file does not change.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def axes(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class OptionsAxes(_Strict):
    constant_folding: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    dynamic: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    precision: list[Literal[PRECISIONS]] = Field(default_factory=lambda: ["fp32"], min_length=1)
    # null: how torch.onnx converts dynamic_axes on each release (Dim.DYNAMIC where it exists)
    dim_policy: list[Optional[Literal[DIM_POLICIES]]] = Field(default_factory=lambda: [None], min_length=1)


IndexUrl = Annotated[str, AfterValidator(lambda v: _check_url(v, ("http", "https", "file")))]


class InstallConfig(_Strict):
    python: PythonVersion = "3.11"
    use_pip_config: bool = True  # also use find-links folders named in pip's configuration
    find_links: list[str] = Field(default_factory=list)
    index_url: IndexUrl | None = None
    extra_index_urls: list[IndexUrl] = Field(default_factory=list)


class Matrix(_Strict):
    torch: list[TorchSpec] = Field(min_length=1)
    exporters: list[Literal[EXPORTERS]] = Field(min_length=1)
    opsets: list[Opset] = Field(min_length=1)
    runtimes: list[RuntimeSpec] = Field(default_factory=lambda: [RuntimeSpec(name="ort-cpu")], min_length=1)
    cases: list[CaseEntry] = Field(min_length=1)
    options: OptionsAxes = Field(default_factory=OptionsAxes)
    include: list[IncludeEntry] = Field(default_factory=list)
    exclude: list[Rule] = Field(default_factory=list)
    xfail: list[XfailEntry] = Field(default_factory=list)
    latency: LatencyProtocol = Field(default_factory=LatencyProtocol)
    threads: int = Field(1, ge=1, le=1024)
    cell_timeout_s: float = Field(600, gt=0, allow_inf_nan=False)
    # Resident memory a worker may reach while it runs a cell (its whole process tree, torch
    # included); null: half the machine's memory; 0: no limit. Over it: a `crash` "MemoryLimit".
    cell_memory_mb: int | None = Field(None, ge=0)
    # Each log (per export group, per worker) keeps its first and last log_max_mb / 2.
    log_max_mb: float = Field(LOG_MAX_MB, gt=0, allow_inf_nan=False)
    # Workers running export/check/load/run/parity at once (latency is always timed alone, after
    # them); null: one per CPU core. `--jobs N` on the command line overrides it.
    jobs: int | None = Field(None, ge=1, le=256)
    install: InstallConfig = Field(default_factory=InstallConfig)
    # After the run: reduce every failing cell's file (load, run, parity) to the smallest graph
    # that still fails (harness.run.reduce), each within reduce_timeout_s.
    reduce: bool = False
    reduce_timeout_s: float = Field(120, gt=0)
    # Export every group twice, each in a fresh process, and record whether the two files are
    # identical (graph fact `determinism`: nodes, initializers, interface; metadata named apart).
    determinism: bool = False

    @field_validator("torch", mode="before")
    @classmethod
    def _torch(cls, v: Any) -> Any:
        return [{"version": x} if isinstance(x, (str, int, float)) else x for x in _as_list(v)]

    @field_validator("runtimes", mode="before")
    @classmethod
    def _runtimes(cls, v: Any) -> Any:
        return [{"name": x} if isinstance(x, str) else x for x in _as_list(v)]

    @field_validator("cases", mode="before")
    @classmethod
    def _cases(cls, v: Any) -> Any:
        from harness.probes.zoo import expand as expand_zoo

        out: list[Any] = []
        for x in _as_list(v):
            if isinstance(x, str) and x in GROUPS:
                out.extend({"target": p} for p in GROUPS[x])
            elif isinstance(x, str) and (zoo := expand_zoo(x)) is not None:
                out.extend(c for c in zoo if c not in out)  # groups may overlap (a task and a type)
            else:
                out.append({"target": x} if isinstance(x, str) else x)
        return out

    @model_validator(mode="after")
    def _unique_cases(self) -> "Matrix":
        labels = [c.label for c in self.cases]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise _KeyError("cases", f"case names must be unique; repeated: {dup} (give each a 'name')")
        versions = [t.version for t in self.torch]
        dup = sorted({x for x in versions if versions.count(x) > 1})
        if dup:
            raise _KeyError("torch", f"expected each torch version once; repeated: {dup}")
        return self

    @model_validator(mode="after")
    def _include_names_known_things(self) -> "Matrix":
        """An include entry's runtime and case must be ones the matrix (or the harness) knows."""
        labels = {r.label for r in self.runtimes}
        cases = {c.label for c in self.cases}
        for i, inc in enumerate(self.include):
            if inc.runtime is not None and inc.runtime not in labels and inc.runtime not in RUNTIMES:
                raise _KeyError(f"include[{i}].runtime",
                                f"expected a runtime of this matrix {sorted(labels)} or one of "
                                f"{sorted(RUNTIMES)} (got {inc.runtime!r})")
            if inc.case is not None and inc.case not in cases:
                try:
                    _check_case_target(inc.case)
                except ValueError:
                    raise _KeyError(f"include[{i}].case", f"expected a case of this matrix "
                                    f"{sorted(cases)}, a built-in probe, 'file.py:function' or "
                                    f"'package.module:function' (got {inc.case!r})") from None
        return self


def _as_list(v: Any) -> Any:
    return v if isinstance(v, list) else [v] if isinstance(v, (str, int, float, dict)) else v


class _KeyError(ValueError):
    """A whole-matrix check that knows the key it is about (pydantic would report '<top>')."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"[{key}] {message}")
        self.key, self.message = key, message


_KEYED = re.compile(r"^\[(?P<key>.+?)\] (?P<msg>.*)$", re.S)


def _loc(parts: tuple, data: Any) -> str:
    """The key path as the user wrote it: a field of a shorthand value ('runtimes: [onnxrt]'
    validated as {name: onnxrt}) is named by the value's own key ('runtimes[0]')."""
    loc, node = "", data
    for part in parts:
        if isinstance(part, str) and (part.startswith("function-") or "[" in part):
            continue   # pydantic's names for validator layers and union members, not keys
        if isinstance(part, int):
            loc += f"[{part}]"
        elif isinstance(node, (dict, list)) or not loc:
            loc += f".{part}" if loc else str(part)
        node = node[part] if isinstance(node, (dict, list)) and _has(node, part) else None
    return loc


def _has(node: Any, part: Any) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(part, int) and 0 <= part < len(node)


MATRICES = Path(__file__).resolve().parent.parent / "matrices"


def shipped_matrix(path: str | Path) -> Path:
    """``path``, or the shipped ``harness/matrices/<name>.yaml`` when ``path`` is a bare name
    (no ``.yaml`` suffix) of a file that does not exist, such as ``--config zoo``."""
    path = Path(path)
    if not path.exists() and not path.suffix and (MATRICES / f"{path.name}.yaml").is_file():
        return MATRICES / f"{path.name}.yaml"
    return path




def _format_error(path: Path, err: dict, data: Any) -> str:
    loc = _loc(err["loc"], data)
    msg = " ".join(err["msg"].removeprefix("Value error, ").split())
    if keyed := _KEYED.match(msg):
        return f"{path}: key '{keyed['key']}': {keyed['msg']}"
    got = err.get("input")
    shown = "" if err["type"] == "missing" else f" (got {_short_repr(got)})"
    return f"{path}: key '{loc or '<top>'}': {msg}{shown}"


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(path: Path, exc: ValidationError, data: Any) -> str:
    """The first problem of a file as one line; other keys with problems are named after it."""
    errors = exc.errors()
    first = _format_error(path, errors[0], data)
    keys = [_loc(e["loc"], data) for e in errors]
    others = [k for k in dict.fromkeys(keys[1:]) if k != keys[0]]
    return first + (f" (also check: {', '.join(repr(k) for k in others[:5])})" if others else "")


def read_config(path: Path) -> Any:
    """The parsed YAML of a matrix file; ConfigError (one line) for anything that is not one."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found; expected a matrix file (YAML)")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; expected a matrix file (YAML)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}); expected a readable matrix file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: byte {exc.start} is not UTF-8 text; expected a matrix file (YAML)") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: holds NUL bytes (a binary file?); expected a matrix file (YAML)")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{path}:{where} not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; expected a matrix file (YAML)") from None


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raise ConfigError (one line naming file, key and
    expectation). Case files are checked too (exist, define the function), without importing.
    A bare name that is not a file (``zoo``) is a matrix shipped in harness/matrices/."""
    path = shipped_matrix(path)
    data = read_config(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: key '<top>': expected a mapping with keys torch, exporters, opsets, "
                          f"cases (got {type(data).__name__})")
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(path, exc, data)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; expected a matrix file (YAML)") from None
    _resolve_case_files(matrix, path)
    return matrix


def _resolve_case_files(matrix: Matrix, path: Path) -> None:
    """Make 'file.py:function' cases absolute: relative to the matrix file, else to the directory
    the command was started from (nox runs sessions from the project root). The file must exist
    and define the function: both are read with ``ast``, never imported (that needs torch)."""
    bases = [path.resolve().parent]
    invoked = os.environ.get("HARNESS_INVOKED_FROM")
    if invoked:
        bases.append(Path(invoked))
    bases.append(Path.cwd())
    targets = [(f"cases[{i}]", case, "target") for i, case in enumerate(matrix.cases)]
    targets += [(f"include[{i}].case", inc, "case") for i, inc in enumerate(matrix.include)]
    for key, holder, attr in targets:
        ref = CaseRef.try_parse(getattr(holder, attr) or "")
        if ref is None or not ref.is_file:
            continue
        file_part, func = ref.target, ref.function
        candidates = [Path(file_part)] if Path(file_part).is_absolute() else [b / file_part for b in bases]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            looked = ", ".join(dict.fromkeys(str(c.parent) for c in candidates))
            raise ConfigError(f"{path}: key '{key}': expected an existing case file; {file_part!r} "
                              f"not found (looked in {looked})")
        if why := _missing_function(found, func):
            raise ConfigError(f"{path}: key '{key}': expected {found} to define {func}(); {why}")
        setattr(holder, attr, f"{found.resolve()}:{func}")


def _missing_function(file: Path, name: str) -> str | None:
    """Why ``file`` does not define ``name`` at module level (None when it does), read with ast."""
    try:
        tree = ast.parse(file.read_bytes(), str(file))
    except SyntaxError as exc:
        return f"it does not parse: {exc.msg} (line {exc.lineno})"
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            # Definitions under `if`/`try` at module level (optional imports, fallbacks).
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    defined.add(sub.id)
                elif isinstance(sub, ast.alias):
                    defined.add((sub.asname or sub.name).split(".")[0])
    if name in defined or "*" in defined:
        return None
    funcs = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return f"it has no top-level {name!r} (functions there: {', '.join(funcs[:10]) or 'none'})"


# Keys added after the first release count in the hash only when set (not at their default), so
# a matrix that does not use them keeps its hash: a run started before they existed still
# resumes (resume checks the hash) and keeps its run-id suffix.
_LATER_DEFAULTS = {("cell_memory_mb",): None, ("log_max_mb",): LOG_MAX_MB,
                   ("options", "dim_policy"): [None], ("reduce",): False, ("reduce_timeout_s",): 120.0,
                   ("determinism",): False}
# Keys that only say how a run is scheduled, never what it finds: never part of the hash, so a
# run resumes with another `jobs`.
_SCHEDULING_KEYS = ("jobs",)


def matrix_hash(matrix: Matrix) -> str:
    data = matrix.model_dump(mode="json")
    for key in _SCHEDULING_KEYS:
        data.pop(key, None)
    for path, default in _LATER_DEFAULTS.items():
        *parents, last = path
        node = data
        for key in parents:
            node = node[key]
        if node.get(last) == default:
            del node[last]
    blob = json.dumps(data, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
