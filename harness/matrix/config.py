"""matrix.yaml: schema, loading and validation with errors that name file, key and expectation."""
from __future__ import annotations

import ast
import contextlib
import fnmatch
import gc
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Optional, Union
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
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.core.cell import AXES, DIM_POLICIES, EXPORTERS, PRECISIONS, CaseRef
from harness.core.job import LatencyProtocol
from harness.matrix.names import name_problem
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


def canonical_release(v: str) -> str:
    """One spelling per release of a package: PEP 440 equal versions (``1.18.1.0``, ``v1.18.1``,
    ``1.18.1``) become one text, so one release is one runtime-only environment. Trailing zero
    components beyond three are dropped and shorter releases padded to three (``1.18`` is
    ``1.18.0``, the release ``==1.18`` installs); pre, post, dev and local parts are kept."""
    ver = Version(v)
    release = list(ver.release)
    while len(release) > 3 and release[-1] == 0:
        release.pop()
    release += [0] * (3 - len(release))
    text = (f"{ver.epoch}!" if ver.epoch else "") + ".".join(map(str, release))
    if ver.pre:
        text += f"{ver.pre[0]}{ver.pre[1]}"
    if ver.post is not None:
        text += f".post{ver.post}"
    if ver.dev is not None:
        text += f".dev{ver.dev}"
    return text + (f"+{ver.local}" if ver.local else "")


def _runtime_release(v: str) -> str:
    return canonical_release(_check_version(v, "a release of the runtime's package such as '1.18.1'"))


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


def is_interpreter(python: str | None) -> bool:
    """Whether a torch entry's ``python`` names an interpreter (a path) rather than a version."""
    return bool(python) and ("/" in python or python.startswith("~"))


# A Docker image reference: [registry[:port]/]name[:tag][@digest], lowercase path components.
IMAGE_REF = re.compile(r"^(?:[A-Za-z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
                        r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
# The packages a torch entry pins by a field of its own (``TorchSpec.numpy`` ...): the one list of
# torch's companions (what the gate can swap back, what a dependency file pins beside torch, what
# an image installs); tests/matrix/test_config.py checks each is a field.
# onnxslim and onnxsim are libraries of pipeline steps (harness.core.steps), installed where a
# pipeline uses them or a torch entry pins them.
COMPANIONS = ("numpy", "onnx", "onnxscript", "protobuf", "onnxslim", "onnxsim")
_PINS = (*COMPANIONS, "extras")


class TorchSpec(_Strict):
    """A torch release to install (a uv venv, or an image built from images/), or an existing
    environment used as it is: an interpreter (``python: /opt/venv/bin/python``) or a local
    Docker image (``image: team/deploy:2026-11``, optionally with the ``python`` inside it).
    An existing environment's ``version``, when given, is the release expected there."""

    version: str | None = None
    python: str | None = None
    image: str | None = None
    numpy: Pin | None = None
    onnx: Pin | None = None
    onnxscript: Pin | None = None
    protobuf: Pin | None = None
    onnxslim: Pin | None = None
    onnxsim: Pin | None = None
    extras: list[Annotated[str, AfterValidator(_check_requirement)]] = Field(default_factory=list)
    # What a probe found in an existing environment (harness.envs.existing): an ExistingEnv.
    _found: Any = PrivateAttr(default=None)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and is_interpreter(v):
            raise ValueError("expected a torch release such as '2.13.0'; an existing interpreter is "
                             "written {python: /path/to/python}")
        return None if v is None else _check_version(v, "a torch release such as '2.13.0'")

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        if v is None or is_interpreter(v):
            if v is not None and (not v.strip() or any(c in v for c in "\x00\n\r")):
                raise ValueError("expected the path of an interpreter such as /opt/venv/bin/python")
            return v
        try:
            return _check_python(v)
        except ValueError:
            raise ValueError("expected a Python version 3.9 or newer such as '3.11', or the path of an "
                             "existing interpreter such as /opt/venv/bin/python") from None

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not IMAGE_REF.match(v):
            raise ValueError("expected a Docker image name such as 'team/deploy:2026-11'")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> "TorchSpec":
        if self.image is not None and self.python is not None and not is_interpreter(self.python):
            raise ValueError(f"python: with an image, expected the interpreter inside it (a path such as "
                             f"/opt/conda/bin/python), not a version (got {self.python!r})")
        if not self.existing and self.version is None:
            raise ValueError("expected a torch release (version: '2.13.0'), an existing interpreter "
                             "(python: /opt/venv/bin/python) or a local Docker image (image: NAME)")
        if self.existing:
            pinned = [k for k in _PINS if getattr(self, k)]
            if pinned:
                raise ValueError(f"an existing environment is used as it is (nothing is installed there); "
                                 f"expected no {pinned[0]!r} pin: what is installed there is what runs")
        return self

    @property
    def existing(self) -> bool:
        """An environment used as it is, not one built from pins."""
        return self.image is not None or is_interpreter(self.python)

    @property
    def python_version(self) -> str | None:
        """The Python version of an environment to build (None for an existing one)."""
        return None if is_interpreter(self.python) else self.python

    @property
    def probed(self) -> bool:
        """An existing environment already read (``found`` is known)."""
        return self._found is not None

    @property
    def found(self) -> Any:
        """What the probe found in this existing environment (an ``ExistingEnv``)."""
        if self._found is None:
            raise RuntimeError(f"{self.where}: not probed yet (harness.envs.existing.probe_matrix)")
        return self._found

    def read_as(self, found: Any) -> "TorchSpec":
        """This existing environment as read (an ``ExistingEnv``): its release is the one found."""
        entry = self.model_copy(update={"version": found.release})
        entry._found = found
        return entry

    @property
    def where(self) -> str:
        if self.image is not None:
            return f"image {self.image}" + (f" ({self.python})" if self.python else "")
        return self.python if self.existing else f"torch {self.version}"


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


def runtime_only_runtimes() -> list[str]:
    """Runtimes a runtime-only environment (harness.envs.runtime_only) can hold: a pip wheel
    that runs on the CPU."""
    return sorted(n for n, r in RUNTIMES.items() if r.registry == "pypi" and not r.needs_gpu
                  and r.family == "cpu")


Tolerance = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# A runtime release in runtime_versions / runtime_floor / deploy, in its one spelling.
RuntimeVersion = Annotated[str, AfterValidator(_runtime_release)]




def _check_name(v: str) -> str:
    if why := name_problem(v):
        raise ValueError(why)
    return v


class CaseEntry(_Strict):
    target: Annotated[str, AfterValidator(_check_case_target)]
    name: Annotated[str, AfterValidator(_check_name)] | None = Field(None, min_length=1)
    atol: Tolerance | None = None
    rtol: Tolerance | None = None
    # Files the case reads that it does not import (weights, configs, vocabularies): paths or
    # globs relative to the matrix file; part of the case's identity for the cache and the gate.
    data_files: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    # How the case's pipelines that end in fp16 or int8 are judged, over the defaults
    # (harness.core.steps.JUDGES; docs/pipelines.md): {int8: {cosine: 0.98, top1: 0.8}}.
    tolerances: dict[Literal["fp16", "int8"], "PipelineTolerance"] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _label_is_a_name(self) -> "CaseEntry":
        """A case without ``name`` is named by its function: that name is checked the same way."""
        if self.name is None and (why := name_problem(self.label)):
            raise ValueError(f"{why}; give the case a shorter 'name'")
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        ref = CaseRef.try_parse(self.target)
        return ref.function if ref else self.target


class PipelineTolerance(_Strict):
    atol: Tolerance | None = None
    rtol: Tolerance | None = None
    cosine: float | None = Field(None, ge=-1, le=1)
    top1: float | None = Field(None, ge=0, le=1)


CaseEntry.model_rebuild()


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
    pipeline: str | None = None
    optimize: bool | None = None
    external_data: bool | None = None

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
    # The dynamo exporter's optimize= and external_data= (null: the release's default); the
    # TorchScript exporter has neither, its cells keep null.
    optimize: list[Optional[bool]] = Field(default_factory=lambda: [None], min_length=1)
    external_data: list[Optional[bool]] = Field(default_factory=lambda: [None], min_length=1)


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
    # Post-export pipelines, an axis like opset (harness.matrix.steps_config; docs/pipelines.md):
    # name -> ordered steps, normalised to {"step": name, "args": {...}}. 'raw': the file as exported.
    pipelines: dict[str, list[Any]] = Field(default_factory=lambda: {"raw": []})
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
    # that still fails (harness.worker.diagnose.reduce), each within reduce_timeout_s.
    reduce: bool = False
    reduce_timeout_s: float = Field(120, gt=0)
    # Export every group twice, each in a fresh process, and record whether the two files are
    # identical (graph fact `determinism`: nodes, initializers, interface; metadata named apart).
    determinism: bool = False
    # Runtime releases tried on each passing cell's exported file in runtime-only environments
    # (no torch, no export): every one listed, the oldest that works (by bisection), the one a
    # team ships (the gate blocks on it). harness.run.post.runtime_floors; checked by _runtime_axes.
    runtime_versions: dict[str, list[RuntimeVersion]] = Field(default_factory=dict)
    runtime_floor: dict[str, list[RuntimeVersion]] = Field(default_factory=dict)
    deploy: dict[str, RuntimeVersion] = Field(default_factory=dict)
    # What each `cases:` glob took and left out (config.expand_glob), for `plan` to say.
    _globs: list[Any] = PrivateAttr(default_factory=list)

    @property
    def globs(self) -> list[Any]:
        return self._globs

    def torch_entry(self, version: str, existing: bool = True) -> TorchSpec:
        """The torch entry for a release: the matrix's own (an existing environment once read
        stands for its release; ``existing=False``: only entries installed here), else one with
        default pins (a bump removes the old version from matrix.yaml, yet it must still be a side)."""
        spec = next((t for t in self.torch if t.version == version and (not t.existing or (existing and t.probed))),
                    None)
        if spec is None:
            try:
                spec = TorchSpec(version=version)
            except ValueError:
                raise ConfigError(f"{version!r} is not a torch release such as '2.13.0'") from None
        return spec

    def one_release(self, version: str, **pins: str) -> "Matrix":
        """The matrix restricted to one torch release (``torch_entry``), with these companions pinned."""
        spec = self.torch_entry(version, existing=not pins)
        return self.model_copy(update={"torch": [spec.model_copy(update=pins) if pins else spec]})

    @field_validator("torch", mode="before")
    @classmethod
    def _torch(cls, v: Any) -> Any:
        return [{"version": x} if isinstance(x, (str, int, float)) else x for x in _as_list(v)]

    @field_validator("latency", mode="before")
    @classmethod
    def _latency(cls, v: Any) -> Any:
        # `unstable_cv` (a coefficient of variation, which single-call outliers inflate) became
        # `unstable_spread` (IQR / 1.349 / median): a matrix written for the old key keeps working.
        if isinstance(v, dict) and "unstable_cv" in v:
            import warnings

            v = dict(v)
            old = v.pop("unstable_cv")
            v.setdefault("unstable_spread", old)
            warnings.warn("latency.unstable_cv is now latency.unstable_spread (a robust spread, "
                          "IQR / 1.349 / median); the value was taken for it", stacklevel=2)
        return v

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
                # Groups may overlap (a task and a type): a zoo case already listed is not added
                # again (a set of what is there, made once per group: linear in the entries).
                seen = {json.dumps(c, sort_keys=True, default=str) for c in out}
                for c in zoo:
                    marker = json.dumps(c, sort_keys=True, default=str)
                    if marker not in seen:
                        seen.add(marker)
                        out.append(c)
            else:
                out.append({"target": x} if isinstance(x, str) else x)
        return out

    @model_validator(mode="after")
    def _unique_cases(self) -> "Matrix":
        # Counted once each (linear): a matrix may list tens of thousands of cases.
        dup = sorted(x for x, n in Counter(c.label for c in self.cases).items() if n > 1)
        if dup:
            shown = f"{dup[:20]}{f' and {len(dup) - 20} more' if len(dup) > 20 else ''}"
            raise _KeyError("cases", f"case names must be unique; repeated: {shown} (give each a 'name')")
        dup = sorted(x for x, n in Counter(t.version for t in self.torch if not t.existing).items() if n > 1)
        if dup:
            raise _KeyError("torch", f"expected each torch version once; repeated: {dup}")
        places = Counter((t.image, t.python) for t in self.torch if t.existing)
        dup = sorted(f"{i or ''} {p or ''}".strip() for (i, p), n in places.items() if n > 1)
        if dup:
            raise _KeyError("torch", f"expected each existing environment once; repeated: {dup}")
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
                ref = CaseRef.try_parse(inc.case)
                if ref is not None and (why := name_problem(ref.function)):
                    raise _KeyError(f"include[{i}].case", f"its function names the case: {why}")
        return self


    @model_validator(mode="after")
    def _pipelines(self) -> "Matrix":
        from harness.matrix.steps_config import StepConfigError, check_pipelines

        try:
            self.pipelines = check_pipelines(self.pipelines)
        except StepConfigError as exc:
            raise _KeyError(exc.key, str(exc)) from None
        for i, inc in enumerate(self.include):
            if inc.pipeline is not None and inc.pipeline not in self.pipelines:
                raise _KeyError(f"include[{i}].pipeline", f"expected a pipeline of this matrix "
                                f"{sorted(self.pipelines)} (got {inc.pipeline!r})")
        return self

    @model_validator(mode="after")
    def _runtime_axes(self) -> "Matrix":
        """runtime_versions / runtime_floor / deploy name CPU pip runtimes this matrix runs."""
        ran = {r.name for r in self.runtimes}
        usable = runtime_only_runtimes()
        for key in ("runtime_versions", "runtime_floor", "deploy"):
            for name, versions in getattr(self, key).items():
                if name not in usable:
                    raise _KeyError(f"{key}.{name}", f"expected a runtime a runtime-only environment can "
                                    f"hold: one of {usable} (got {name!r})")
                if name not in ran:
                    raise _KeyError(f"{key}.{name}", f"expected a runtime of this matrix's 'runtimes' "
                                    f"{sorted(ran)}: its passing cells' files are what is tried")
                if isinstance(versions, list) and not versions:
                    raise _KeyError(f"{key}.{name}", "expected at least one release")
                if isinstance(versions, list) and len(set(versions)) != len(versions):
                    raise _KeyError(f"{key}.{name}", f"expected each release once (got {versions})")
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


class _DuplicateKey(Exception):
    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _check_unique_keys(node: yaml.Node, where: str = "", seen_nodes: set[int] | None = None) -> None:
    """Raise _DuplicateKey for the first mapping, at any depth, that gives a key twice (YAML
    itself lets the last one win silently). Aliased nodes are walked once."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                name = f"{where}.{key_node.value}" if where else key_node.value
                line = key_node.start_mark.line + 1
                if (key_node.tag, key_node.value) in first:
                    raise _DuplicateKey(name, first[(key_node.tag, key_node.value)], line)
                first[(key_node.tag, key_node.value)] = line
            else:
                name = f"{where}.<key>" if where else "<key>"
            _check_unique_keys(value_node, name, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{where}[{i}]", seen_nodes)


# libyaml's parser where PyYAML has it (about twice as fast on a matrix of many cases; it also
# bounds nesting depth itself), else PyYAML's own.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_unique(text: str) -> Any:
    """``yaml.safe_load``, refusing a key given twice in one mapping."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_unique_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


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
        return _load_unique(text)
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: key '{exc.key}': given twice (line {exc.first} and line "
                          f"{exc.second}); expected each key once") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{path}:{where} not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; expected a matrix file (YAML)") from None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: loading and planning make many objects and no
    cycles, and each collection walks every live object, so a matrix of 100,000 cases would
    take time growing faster than its size (measured in `nox -s bench`: plan_scaling)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file; raise ConfigError (one line naming file, key and
    expectation). Case files are checked too (exist, define the function), without importing.
    A bare name that is not a file (``zoo``) is a matrix shipped in harness/matrices/."""
    with gc_paused():
        return _load_matrix(shipped_matrix(path))


def _load_matrix(path: Path) -> Matrix:
    data = read_config(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: key '<top>': expected a mapping with keys torch, exporters, opsets, "
                          f"cases (got {type(data).__name__})")
    globs: list[GlobExpansion] = []
    data = expand_case_globs(data, path, globs)
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(path, exc, data)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; expected a matrix file (YAML)") from None
    _resolve_case_files(matrix, path)
    matrix._globs = globs
    return matrix


_SKIP_DIRS = {".git", ".venv", "venv", ".envs", ".nox", ".tox", "node_modules", "site-packages", "reports",
              "build", "dist", "__pycache__"}


@dataclass
class GlobExpansion:
    """What a ``cases:`` glob took (``file.py:function`` references, in order) and the functions
    it matched but left out, each with the reason."""

    key: str                                   # "cases[2]"
    pattern: str
    took: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)   # ("file.py:name", why)

    def lines(self) -> list[str]:
        """What ``plan`` prints: one line per glob, one per function left out (names from the
        file system shown with their control characters escaped: one line each)."""
        def shown(text: str) -> str:
            return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)
        out = [f"{self.key} {shown(self.pattern)}: took {len(self.took)} case function(s): "
               + ", ".join(t.rsplit(":", 1)[1] for t in self.took)]
        out += [f"  left out {shown(name)}: {shown(why)}" for name, why in self.left]
        return out


def _parse_file(file: Path) -> ast.Module | str:
    """The module's tree, or why it cannot be read (it is never imported)."""
    try:
        return ast.parse(file.read_bytes(), str(file))
    except SyntaxError as exc:
        return f"it does not parse: {exc.msg} (line {exc.lineno})"
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"


def _why_not_a_case(node: ast.AST, private_ok: bool = False) -> str | None:
    """Why a top-level function cannot be a case (None: it can, whatever its body holds)."""
    if isinstance(node, ast.AsyncFunctionDef):
        return "async; a case is called, not awaited"
    if node.name.startswith("_") and not private_ok:
        return "private, its name starts with _ (a glob starting with _ takes it)"
    a = node.args
    required = [x.arg for x in a.posonlyargs + a.args][: len(a.posonlyargs) + len(a.args) - len(a.defaults)]
    required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if required:
        return f"needs arguments ({', '.join(required)}); a case is called with none"
    return None


def case_candidates(file: Path, private_ok: bool = False) -> tuple[list[str], list[tuple[str, str]]]:
    """The top-level functions of ``file`` (read with ``ast``, never imported): those a glob takes
    as cases (callable without arguments, public unless ``private_ok``, whatever their body is:
    one that returns no case is a recorded failure naming it) and those it leaves out, with why."""
    tree = _parse_file(file)
    if isinstance(tree, str):
        return [], [("*", tree)]
    took, left = [], []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            why = _why_not_a_case(node, private_ok)
            if why is None:
                took.append(node.name)
            else:
                left.append((node.name, why))
    return took, left


def case_functions(file: Path) -> list[str]:
    """The functions a ``file.py:*`` glob takes as cases (see ``case_candidates``)."""
    return case_candidates(file)[0]


def expand_glob(case: str, key: str, base: Path) -> GlobExpansion:
    """The case functions a ``file-glob:function-glob`` reference stands for, in sorted files,
    relative to ``base`` (the matrix file's folder) unless absolute, and what it left out."""
    file_glob, _, func_glob = case.rpartition(":")
    root, pattern = base, file_glob
    if Path(file_glob).is_absolute():   # written out as absolute paths, e.g. by the gate
        root, pattern = Path(Path(file_glob).anchor), str(Path(file_glob).relative_to(Path(file_glob).anchor))
    out = GlobExpansion(key, case)
    for file in sorted(root.glob(pattern)):
        rel = file.relative_to(root)
        if not file.is_file() or any(p in _SKIP_DIRS or p.startswith(".") for p in rel.parts[:-1]):
            continue
        name = str(file) if root is not base else rel.as_posix()
        took, left = case_candidates(file, private_ok=func_glob.startswith("_"))
        out.took += [f"{name}:{fn}" for fn in took if fnmatch.fnmatchcase(fn, func_glob)
                     and f"{name}:{fn}" not in out.took]
        out.left += [(f"{name}:{fn}", why) for fn, why in left if fn == "*" or fnmatch.fnmatchcase(fn, func_glob)]
    return out


def expand_case_globs(data: dict, path: Path, expansions: list[GlobExpansion] | None = None) -> dict:
    """``cases: ["models/*.py:*"]``: a case whose file or function part holds a glob (``*``,
    ``?``, ``[``) stands for every function matching it that a case can be (``case_candidates``)
    in the files matching it, relative to the matrix file, in sorted order; ``expansions`` gets
    what each glob took and left out. A glob taking none is an error naming the key."""
    cases = data.get("cases")
    if not isinstance(cases, list):
        return data
    base = path.resolve().parent
    out: list[Any] = []
    for i, case in enumerate(cases):
        ref = CaseRef.try_parse(case.replace("*", "x").replace("?", "x")) if isinstance(case, str) else None
        if ref is None or not ref.is_file or not re.search(r"[*?\[]", case):
            out.append(case)
            continue
        found = expand_glob(case, f"cases[{i}]", base)
        if not found.took:
            left = "; ".join(f"{n}: {why}" for n, why in found.left[:5])
            raise ConfigError(f"{path}: key 'cases[{i}]': expected {case!r} to match case functions "
                              f"(top-level, callable without arguments) in files under {base}; it matches "
                              + (f"none it can take: {left}" if left else "none"))
        if expansions is not None:
            expansions.append(found)
        out.extend(f for f in found.took if f not in out)
    return {**data, "cases": out}


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
    # Each file is found and read once, however many cases name it.
    files: dict[str, tuple[Path | None, list[Path]]] = {}
    checked: dict[tuple[Path, str], str | None] = {}
    parsed: dict[Path, Any] = {}
    for key, holder, attr in targets:
        ref = CaseRef.try_parse(getattr(holder, attr) or "")
        if ref is None or not ref.is_file:
            continue
        file_part, func = ref.target, ref.function
        if file_part not in files:
            candidates = [Path(file_part)] if Path(file_part).is_absolute() else [b / file_part for b in bases]
            found = next((c for c in candidates if c.is_file()), None)
            files[file_part] = (found.resolve() if found else None, candidates)
        found, candidates = files[file_part]
        if found is None:
            looked = ", ".join(dict.fromkeys(str(c.parent) for c in candidates))
            raise ConfigError(f"{path}: key '{key}': expected an existing case file; {file_part!r} "
                              f"not found (looked in {looked})")
        if (found, func) not in checked:
            checked[(found, func)] = _missing_function(found, func, parsed)
        if why := checked[(found, func)]:
            raise ConfigError(f"{path}: key '{key}': expected {found} to define {func}(); {why}")
        setattr(holder, attr, f"{found}:{func}")


def _missing_function(file: Path, name: str, parsed: "dict[Path, Any] | None" = None) -> str | None:
    """Why ``file`` does not define ``name`` at module level (None when it does), read with ast
    (``parsed``: trees, or the reason a file does not parse, already known by file)."""
    if parsed is not None and file in parsed:
        tree = parsed[file]
    else:
        try:
            tree = ast.parse(file.read_bytes(), str(file))
        except SyntaxError as exc:
            tree = f"it does not parse: {exc.msg} (line {exc.lineno})"
        except (OSError, ValueError) as exc:
            tree = f"it cannot be read ({exc})"
        if parsed is not None:
            parsed[file] = tree
    if isinstance(tree, str):
        return tree
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
                   ("determinism",): False, ("runtime_versions",): {}, ("runtime_floor",): {},
                   ("deploy",): {}, ("latency", "confirm"): True, ("latency", "confirm_processes"): 4,
                   ("options", "optimize"): [None], ("options", "external_data"): [None],
                   ("pipelines",): {"raw": []}}
# Keys that only say how a run is scheduled, never what it finds: never part of the hash, so a
# run resumes with another `jobs`.
_SCHEDULING_KEYS = ("jobs",)


def matrix_hash(matrix: Matrix) -> str:
    data = matrix.model_dump(mode="json")
    for key in _SCHEDULING_KEYS:
        data.pop(key, None)
    for entry in data.get("torch", []):
        for later in ("image", "onnxslim", "onnxsim"):
            if entry.get(later) is None:
                entry.pop(later, None)   # added later: counts only when set
    for case in data.get("cases", []):
        for later in ("data_files", "tolerances"):
            if not case.get(later):
                case.pop(later, None)   # added later: counts only when set
    for path, default in _LATER_DEFAULTS.items():
        *parents, last = path
        node = data
        for key in parents:
            node = node[key]
        if node.get(last) == default:
            del node[last]
    blob = json.dumps(data, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
