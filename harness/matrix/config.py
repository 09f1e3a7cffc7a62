"""matrix.yaml: schema, loading and validation with errors that name file, key and expectation."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from harness.core.cell import AXES, EXPORTERS, PRECISIONS, CaseRef
from harness.core.job import LatencyProtocol
from harness.matrix.rules import ConfigError
from harness.runtimes import RUNTIMES

Scalar = Union[str, int, float, bool]


def _check_opset(v: int) -> int:
    if not 7 <= v <= 26:
        raise ValueError("expected an ONNX opset between 7 and 26")
    return v


Opset = Annotated[int, AfterValidator(_check_opset)]


def _check_axes(rule: dict) -> dict:
    unknown = [k for k in rule if k not in AXES]
    if unknown:
        raise ValueError(f"unknown axis {unknown[0]!r}; expected keys among {list(AXES)}")
    return rule


Rule = Annotated[dict[str, Union[Scalar, list[Scalar]]], AfterValidator(_check_axes)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TorchSpec(_Strict):
    version: str
    python: str | None = None
    numpy: str | None = None
    onnx: str | None = None
    onnxscript: str | None = None
    protobuf: str | None = None
    extras: list[str] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        from packaging.version import InvalidVersion, Version

        try:
            Version(v)
        except InvalidVersion:
            raise ValueError("expected a torch release such as '2.13.0'") from None
        return v


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

    @property
    def label(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


class CaseEntry(_Strict):
    target: str
    name: str | None = None
    atol: float | None = None
    rtol: float | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        ref = CaseRef.try_parse(self.target)
        return ref.function if ref else self.target


class XfailEntry(_Strict):
    match: dict[str, Scalar | list[Scalar]]
    reason: str = Field(min_length=3)
    link: str = Field(min_length=8)

    @field_validator("match")
    @classmethod
    def _axes(cls, v: dict) -> dict:
        return _check_axes(v)


class OptionsAxes(_Strict):
    constant_folding: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    dynamic: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    precision: list[Literal[PRECISIONS]] = Field(default_factory=lambda: ["fp32"], min_length=1)


class InstallConfig(_Strict):
    python: str = "3.11"
    use_pip_config: bool = True  # also use find-links folders named in pip's configuration
    find_links: list[str] = Field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)


class Matrix(_Strict):
    torch: list[TorchSpec] = Field(min_length=1)
    exporters: list[Literal[EXPORTERS]] = Field(min_length=1)
    opsets: list[Opset] = Field(min_length=1)
    runtimes: list[RuntimeSpec] = Field(default_factory=lambda: [RuntimeSpec(name="ort-cpu")], min_length=1)
    cases: list[CaseEntry] = Field(min_length=1)
    options: OptionsAxes = Field(default_factory=OptionsAxes)
    include: list[Annotated[dict[str, Scalar], AfterValidator(_check_axes)]] = Field(default_factory=list)
    exclude: list[Rule] = Field(default_factory=list)
    xfail: list[XfailEntry] = Field(default_factory=list)
    latency: LatencyProtocol = Field(default_factory=LatencyProtocol)
    threads: int = Field(1, ge=1)
    cell_timeout_s: float = Field(600, gt=0)
    install: InstallConfig = Field(default_factory=InstallConfig)

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
        from harness.probes import GROUPS
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
            raise ValueError(f"case names must be unique; repeated: {dup} (give each a 'name')")
        return self


def _as_list(v: Any) -> Any:
    return v if isinstance(v, list) else [v] if isinstance(v, (str, int, float, dict)) else v


def _format_error(path: Path, err: dict, data: Any) -> str:
    loc = ""
    node = data
    for part in err["loc"]:
        if isinstance(part, int):
            loc += f"[{part}]"
        elif isinstance(node, (dict, list)) or not loc:
            loc += f".{part}" if loc else str(part)
        node = node[part] if isinstance(node, (dict, list)) and _has(node, part) else None
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if err["type"] == "missing" else f" (got {got!r})"
    return f"{path}: key '{loc or '<top>'}': {msg}{shown}"


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


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raise ConfigError naming file, key and expectation."""
    path = shipped_matrix(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with keys torch, exporters, opsets, cases")
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(path, e, data) for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None
    _resolve_case_files(matrix, path)
    return matrix


def _resolve_case_files(matrix: Matrix, path: Path) -> None:
    """Make 'file.py:function' cases absolute: relative to the matrix file, else to the directory
    the command was started from (nox runs sessions from the project root)."""
    bases = [path.resolve().parent]
    invoked = os.environ.get("HARNESS_INVOKED_FROM")
    if invoked:
        bases.append(Path(invoked))
    bases.append(Path.cwd())
    for i, case in enumerate(matrix.cases):
        ref = CaseRef.try_parse(case.target)
        if ref is None or not ref.is_file:
            continue
        file_part, func = ref.target, ref.function
        candidates = [Path(file_part)] if Path(file_part).is_absolute() else [b / file_part for b in bases]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            # Not fatal here (plans and validation still work); each of its cells fails at export
            # with this message and a traceback in its log.
            looked = ", ".join(str(c.parent) for c in candidates)
            print(f"warning: {path}: key 'cases[{i}]': case file {file_part!r} not found "
                  f"(looked in {looked})", file=sys.stderr)
            continue
        case.target = f"{found.resolve()}:{func}"


def matrix_hash(matrix: Matrix) -> str:
    blob = json.dumps(matrix.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
