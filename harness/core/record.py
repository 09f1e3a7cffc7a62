"""The result record (schema v1): one JSON object per cell, appended to results.jsonl.

``Record`` is the one type every stage after the worker reads; it is created in exactly one
place, ``Record.for_cell``. Its ``parity`` and ``latency_ms`` parts are typed (``Parity``,
``Latency``) and serialise to the same JSON keys as before. Standard library only: the worker
imports this inside every environment.

Reading and writing results.jsonl has one validation path, ``Record.from_dict``: every line is
checked for being JSON, an object, a known schema, and for the type of every field a reader
relies on; a bad one is a ``RecordError`` naming ``file:line`` and why. What each reader does:

- ``read_records`` / ``iter_records`` (reports, gate, store, merge): a bad line anywhere, or a cell
  id recorded twice, raises ``RecordError`` (a ``SchemaError``: the CLI prints one line, exit 2).
  The one exception is a torn tail, a last line without its newline (what a write interrupted by a
  kill leaves): it is reported on stderr with its byte offset and not read.
- ``cut_torn_tail`` (the runner, before resuming and before every append): the torn tail is cut
  off and reported, so a record is only ever appended after a newline; a bad line before it makes
  the runner refuse to resume (``read_records`` raises).
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypedDict

from harness.core.cell import CellKey, ExportOptions
from harness.core.passes import PASSES
from harness.core.status import STAGES, Stage, Status
from harness.core.text import ENCODE_ERRORS, safe_text

SCHEMA_VERSION = 1


class SchemaError(ValueError):
    """A results file this version cannot read."""


class RecordError(SchemaError):
    """A record that is not one: not JSON, not an object, a field missing or of the wrong type,
    an unknown status, a cell recorded twice. ``where`` is ``file:line`` once known."""

    def __init__(self, reason: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.reason, self.where = reason, where

    def at(self, where: str) -> "RecordError":
        return RecordError(self.reason, where)


def _split(cls: type, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    known = {f.name for f in fields(cls)} - {"extra"}
    return ({k: v for k, v in data.items() if k in known},
            {k: v for k, v in data.items() if k not in known})


@dataclass
class Parity:
    """Worst errors against eager over every shape checked, and the per-shape details."""

    max_abs: float | None = None
    max_rel: float | None = None
    atol: float | None = None
    rtol: float | None = None
    shapes: list[dict[str, Any]] = field(default_factory=list)
    # The model's own float32 noise (harness.worker.noise): how the floor was measured, whether it
    # was judged, the worst ratio and its floor; per output in shapes[i]["outputs"][j].
    noise: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # keys written by other versions

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Parity":
        known, extra = _split(cls, dict(data or {}))
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        # Its own fields, as Record.to_dict and Blame.to_dict give theirs (``asdict`` would copy
        # every shape's every output, each time a record is written or a report is made).
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out = {k: v for k, v in out.items() if v not in (None, [])}
        return dict(sorted({**out, **self.extra}.items()))  # stored order: results.jsonl sorts keys

    def __bool__(self) -> bool:
        return bool(self.to_dict())


# Latency attributes whose stored (schema v1) key is an older name: attribute → key.
LATENCY_KEYS = {"binding_overhead_ms": "floor_ms"}
LATENCY_FIELDS = {key: name for name, key in LATENCY_KEYS.items()}


@dataclass
class Latency:
    """Latency summary in milliseconds (see ``harness.worker.latency``) with a bounded sample.

    ``ci_low``/``ci_high``: the confidence interval of the median (order statistics);
    ``stop``: why sampling ended ("converged", "time_cap", "max_runs"); ``binding_overhead_ms``:
    the runtime binding's own per-call median on an identity model (stored as ``floor_ms``, its
    schema v1 key, from before "floor" came to mean only a runtime floor). ``spread``: the robust spread
    (IQR / 1.349 / median) that decides ``unstable`` with the interval; ``loaded``/``load``: the
    machine was busy with other work while the calls were timed (``harness.worker.machine_load``).
    ``unstable_why``: what made it unstable. ``processes``: the medians of the fresh processes
    that timed it (the protocol's own first; ``harness.run.confirm``): where two disagreed, the
    median is theirs, and ``bimodal`` with ``modes`` ([lower, upper] ms) when they split in two.
    ``same_file_as``: the cell whose timing this is, taken once for both in each latency worker
    (the same file, feeds, runtime and runtime options; ``harness.worker.stages.SameFileTimings``).
    ``samples``: every value up to
    1,000 in time order, beyond that 1,000 evenly spaced order statistics; records written before
    these keys existed keep all their samples and lack the other keys.
    """

    median: float | None = None
    p90: float | None = None
    min: float | None = None
    mean: float | None = None
    iqr: float | None = None
    cv: float | None = None
    spread: float | None = None
    unstable: bool | None = None
    iterations: int | None = None
    threads: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    stop: str | None = None
    warmup_iterations: int | None = None
    warmup_stable: bool | None = None
    binding_overhead_ms: float | None = None
    loaded: bool | None = None
    load: dict[str, Any] = field(default_factory=dict)
    unstable_why: str | None = None
    processes: list[float] = field(default_factory=list)
    bimodal: bool | None = None
    modes: list[float] = field(default_factory=list)
    same_file_as: str | None = None
    samples: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Latency":
        data = {LATENCY_FIELDS.get(k, k): v for k, v in (data or {}).items()}
        known, extra = _split(cls, data)
        return cls(**known, extra=extra)

    def to_dict(self, samples: bool = True) -> dict[str, Any]:
        # Flat fields: no deep copy (``asdict`` would walk each of up to 1,000 samples).
        out = {LATENCY_KEYS.get(f.name, f.name): getattr(self, f.name) for f in fields(self)}
        out = {k: (list(v) if k in ("samples", "processes", "modes") else v) for k, v in out.items()
               if k != "extra" and v is not None and (k != "samples" or (samples and v))
               and (k not in ("load", "processes", "modes") or v)}
        return dict(sorted({**out, **self.extra}.items()))  # stored order: results.jsonl sorts keys

    def __bool__(self) -> bool:
        return self.median is not None or bool(self.extra)

    @property
    def interval(self) -> tuple[float, float] | None:
        """The recorded confidence interval of the median, or None (records before it existed)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low, self.ci_high


# Who a failing cell is reported to (``Blame.party``) and the repository of each.
PARTIES = ("exporter", "runtime-optimizer", "runtime-kernel", "runtime-precision", "model-code", "unknown",
           "pipeline-step")   # a post-export step's library (harness.core.steps names its repository)
EXPORTER_REPOSITORIES = {"torchscript": "pytorch/pytorch", "dynamo": "pytorch/pytorch",
                         "optimum": "huggingface/optimum"}
RUNTIME_REPOSITORIES = {"ort": "microsoft/onnxruntime", "openvino": "openvinotoolkit/openvino",
                        "tensorrt": "NVIDIA/TensorRT"}
SPEC_REPOSITORY = "onnx/onnx"
ONNXSCRIPT_REPOSITORY = "microsoft/onnxscript"
MODEL_OWNER = "model owner"   # a layer's repository when the fix is in the model's own code

# The layers of the stack a failure is blamed on (``Blame.layer``) and who owns each; the runtime
# layers are named "runtime: <runtime>" and owned by ``runtime_repository``.
LAYERS = {
    "model code": MODEL_OWNER,
    "capture: torch.export": "pytorch/pytorch",
    "capture: jit.trace": "pytorch/pytorch",
    "translation: torch": "pytorch/pytorch",
    "translation: onnxscript": ONNXSCRIPT_REPOSITORY,
    "optimizer: onnxscript": ONNXSCRIPT_REPOSITORY,
    "version converter: onnx": SPEC_REPOSITORY,
    "version converter: onnxscript": ONNXSCRIPT_REPOSITORY,
    "exporter: optimum": "huggingface/optimum",
    "undetermined": None,
}
KINDS = ("bug", "documented limitation", "undetermined")


def runtime_repository(runtime: str) -> str | None:
    """The repository a runtime's bugs are reported to ('ort-cpu' -> microsoft/onnxruntime)."""
    return next((repo for prefix, repo in RUNTIME_REPOSITORIES.items() if runtime.startswith(prefix)), None)


@dataclass
class Blame:
    """Whose bug a failing cell is (``harness.worker.diagnose.blame``): the party, the repository to report
    it to (None for the model's own code), why, and the evidence: the rungs of the ladder, each
    ``{rung, outcome, detail, seconds}`` (outcome: agrees, differs, fails, no-reference,
    unavailable). ``source`` is the model's source line torch or the scan names; ``divergence``
    the first ONNX node whose value differs from torch's (``harness.worker.diagnose.divergence``).

    The layer of the stack that broke (``harness.worker.diagnose.layers``): ``layer`` (one of
    ``LAYERS``), ``kind`` (``bug``, ``documented limitation`` or ``undetermined``), ``docs`` (the
    documentation a limitation is written in), ``experiments`` (what was tried to decide it, each
    ``{experiment, outcome, detail, seconds}``) and ``remedies`` (changes seen to make this cell's
    case work: from the cell's own experiments and, after the run, from the matrix's other cells).
    Records written before layers existed have none of them and read the same."""

    party: str
    reason: str
    repository: str | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    source: str | None = None
    divergence: dict[str, Any] | None = None
    seconds: float | None = None
    layer: str | None = None
    kind: str | None = None
    docs: list[str] = field(default_factory=list)
    experiments: list[dict[str, Any]] = field(default_factory=list)
    remedies: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Blame":
        known, extra = _split(cls, dict(data))
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out = {k: v for k, v in out.items() if v is not None and v != []}
        return dict(sorted({**out, **self.extra}.items()))

    def rung(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.evidence if r.get("rung") == name), None)

    def hint(self) -> str | None:
        """The cell's hint, from the blame alone (one source of truth): the layer, its kind and
        whose it is, then the remedies seen to work, else 'nothing tried works' and the
        documentation. None for a blame without a layer (records before layers existed)."""
        if not self.layer:
            return None
        whose = self.repository or ("the model's owner" if self.layer == "model code" else "undetermined")
        head = f"{self.layer} ({self.kind or 'bug'}; {whose})"
        if self.remedies:
            tail = "works with " + "; or ".join(self.remedies[:3])
        else:
            tried = ", ".join(e.get("experiment", "?") for e in self.experiments
                              if e.get("outcome") not in ("read", "not run")) or "no other export"
            tail = f"nothing tried works (tried: {tried})"
        docs = f"; see {self.docs[0]}" if self.docs else ""
        return f"{head}: {tail}{docs}"


class GraphFacts(TypedDict, total=False):
    """``Record.graph``: facts of the exported file and of what was done with it, a JSON object
    read by the report, drift, diagnosis, blame, the gate and the checks. The keys every module
    may rely on are these; the object keeps any other key (written by other versions or later
    stages) as it is, so a new fact extends it without a schema change."""

    # the file (harness.worker.export.graph_facts)
    opset: int | None
    opset_imports: dict[str, int]
    ir_version: int
    nodes: int
    ops: dict[str, int]
    bytes: int
    io: dict[str, list[dict[str, Any]]]       # names, dtypes, shapes with symbolic dims
    inputs: list[str]
    outputs: list[str]
    producer: str
    # how it was made and checked
    capture_strategy: str                      # dynamo: torch.export strict / non-strict / fallback
    specialised: list[dict[str, Any]]          # declared dynamic dims the file fixes (or, confirmed
                                               # at the second shape, the exported program pins)
    export_specialised: list[dict[str, Any]]   # dims torch fixed while exporting (run.export_log)
    zero_one: list[dict[str, Any]]             # failing dims with an example size of 0 or 1
    determinism: dict[str, Any]                # determinism: true, two fresh exports compared
    optimum_validation: dict[str, Any]         # the optimum exporter's own validation
    runtime_facts: dict[str, Any]              # what the runtime says of the run
    reduced: dict[str, Any]                    # joined from reductions.jsonl on read


@dataclass
class Record:
    run_id: str
    case: str
    torch: str
    exporter: str
    opset: int
    runtime: str
    status: Status
    stage: Stage | None = None     # the first stage that failed (a str enum, stored as its value)
    error: str | None = None
    schema: int = SCHEMA_VERSION
    cell_id: str = ""
    env: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    opset_actual: int | None = None
    parity: Parity = field(default_factory=Parity)
    latency_ms: Latency = field(default_factory=Latency)
    versions: dict[str, Any] = field(default_factory=dict)
    duration_s: dict[str, float] = field(default_factory=dict)
    graph: GraphFacts = field(default_factory=dict)   # type: ignore[assignment]
    signature: str | None = None
    hint: str | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    log: str | None = None
    bundle: str | None = None
    repro: str | None = None
    finished_at: float | None = None
    # Seconds the cell took: its group's reference, export and check (shared by the group's
    # cells) and its own stages, in wall time and in CPU time of its processes; for a timeout,
    # the time since the cell's last progress, when the runner stopped it.
    wall_s: float | None = None
    cpu_s: float | None = None
    # The cell cache (harness.store.cache): the digest of everything that decides this result
    # (null: never reused), and the run that produced it when it was taken from the store.
    cache_key: str | None = None
    cached_from: str | None = None
    # Every file the case loaded from outside the environment's packages (harness.worker.loaded):
    # name (relative to the matrix file's folder where inside it) → content hash. A stored cell
    # stands for a new one only while each is unchanged (harness.core.files).
    case_files: dict[str, str] = field(default_factory=dict)
    # Whose bug a failing cell is (records written before blame existed have none).
    blame: Blame | None = None
    # Optional passes asked for this cell that could not be made (harness.core.passes), pass
    # name → why: a blame ladder that broke, a bundle that could not be written, runtime releases
    # that could not be tried on its file. Empty (and not written) when every pass ran.
    passes_not_run: dict[str, str] = field(default_factory=dict)
    # How the cell's file was made (harness.worker.capture_reuse): {"how": "reused-capture",
    # "shared_by": groups, "capture_s": seconds} from a capture shared by the opsets of one case,
    # release and options, or {"how": "per-opset", "reason": why not}. None (not written): a
    # record made before capture reuse, or one that never exported.
    export_made: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        self.stage = Stage(self.stage) if self.stage is not None else None
        # A case's texts are data: a lone surrogate (os.fsdecode of a non-UTF-8 name) becomes
        # its escape here, so that every hash, file and page made from a record can encode it.
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, safe_text(value))
        if self.notes:
            self.notes = [safe_text(n) if isinstance(n, str) else n for n in self.notes]
        if isinstance(self.parity, dict):
            self.parity = Parity.from_dict(self.parity)
        if isinstance(self.latency_ms, dict):
            self.latency_ms = Latency.from_dict(self.latency_ms)
        if isinstance(self.blame, dict):
            self.blame = Blame.from_dict(self.blame)

    @classmethod
    def for_cell(cls, run_id: str, key: CellKey, torch: str, env: str, status: Status,
                 cell_id: str | None = None, **kw: Any) -> "Record":
        """The one constructor of a new record: a cell's identity plus what happened to it."""
        return cls(run_id=run_id, case=key.case, torch=torch, exporter=key.exporter,
                   opset=key.opset, runtime=key.runtime, status=status,
                   cell_id=cell_id or key.cell_id(torch), env=env,
                   options=key.options.to_dict(), finished_at=time.time(), **kw)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["status"] = self.status.value
        out["stage"] = None if self.stage is None else Stage(self.stage).value
        out["parity"] = self.parity.to_dict()
        out["latency_ms"] = self.latency_ms.to_dict()
        if self.blame is None:
            del out["blame"]   # records without blame are written as before
        else:
            out["blame"] = self.blame.to_dict()
        if not self.passes_not_run:
            del out["passes_not_run"]   # and so are those whose passes all ran
        if self.export_made is None:
            del out["export_made"]
        return out

    def pass_not_run(self, name: str, reason: str) -> None:
        """Record that the optional pass ``name`` could not be made for this cell, and why."""
        if name not in PASSES:
            raise ValueError(f"unknown pass {name!r} (expected one of {', '.join(PASSES)})")
        self.passes_not_run[name] = safe_text(" ".join(str(reason).split()))[:400]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: Any) -> "Record":
        """The one way a stored or received record is read: migrated, then validated (every
        field a reader relies on has its type); ``RecordError`` says what is wrong."""
        if not isinstance(data, dict):
            raise RecordError(f"not a record: expected a JSON object, got {_kind(data)}")
        data = migrate(dict(data))
        _validate(data)
        known, extra = _split(cls, data)
        rec = cls(**known)
        if extra:
            rec.options = {**rec.options, **{f"x_{k}": v for k, v in extra.items()}}
        return rec

    @property
    def opset_kept(self) -> bool:
        """The requested opset is a promise: False where the exported file declares another one
        (torch's dynamo exporter writes 18 when it cannot convert down). Such a cell is never
        counted as a configuration of the requested opset (advisor, gate)."""
        return self.opset_actual is None or int(self.opset_actual) == int(self.opset)

    @property
    def opset_mark(self) -> str | None:
        """'asked 13, got 18' where the file declares another opset than the cell asked for."""
        return None if self.opset_kept else f"asked {self.opset}, got {self.opset_actual}"

    @property
    def export_options(self) -> ExportOptions:
        return ExportOptions.from_dict(self.options)

    @property
    def key(self) -> CellKey:
        """Identity of the cell across runs: what the gate and the reports compare on."""
        return CellKey(self.case, self.exporter, int(self.opset), self.runtime, self.export_options)


_TEXT_FIELDS = ("run_id", "case", "torch", "exporter", "runtime", "error", "cell_id", "env",
                "signature", "hint", "reason", "log", "bundle", "repro", "cache_key", "cached_from")


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_NUMBER_TYPES = frozenset({int, float})


def _numbers(value: Any) -> bool:
    """A list of numbers (``_is_number`` each). A timing's samples run to thousands a record:
    their types are compared as a set first, each element checked only when that fails."""
    return isinstance(value, list) and (set(map(type, value)) <= _NUMBER_TYPES
                                        or all(_is_number(x) for x in value))


# Field → (check, expectation); None is allowed where the expectation says so.
_STR = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_OPT_STR = (lambda v: v is None or isinstance(v, str), "a string or null")
_OPT_STAGE = (lambda v: v is None or v in STAGES, f"one of {', '.join(STAGES)} or null")
_OPT_INT = (lambda v: v is None or _is_int(v), "an integer or null")
_OPT_NUM = (lambda v: v is None or _is_number(v), "a number or null")
_OPT_OBJ = (lambda v: v is None or isinstance(v, dict), "an object or null")
_REQUIRED = {"run_id": _STR, "case": _STR, "torch": _STR, "exporter": _STR,
             "opset": (_is_int, "an integer"), "runtime": _STR}
_OPTIONAL = {
    "cell_id": _OPT_STR, "env": _OPT_STR, "stage": _OPT_STAGE, "error": _OPT_STR, "signature": _OPT_STR, "hint": _OPT_STR,
    "reason": _OPT_STR, "log": _OPT_STR, "bundle": _OPT_STR, "repro": _OPT_STR,
    "cache_key": _OPT_STR, "cached_from": _OPT_STR,
    "opset_actual": _OPT_INT, "finished_at": _OPT_NUM, "wall_s": _OPT_NUM, "cpu_s": _OPT_NUM,
    "options": _OPT_OBJ, "parity": _OPT_OBJ, "latency_ms": _OPT_OBJ, "versions": _OPT_OBJ,
    "duration_s": _OPT_OBJ, "graph": _OPT_OBJ, "blame": _OPT_OBJ, "export_made": _OPT_OBJ,
    "case_files": (lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items())), "an object of strings"),
    "notes": (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
              "a list of strings"),
    "passes_not_run": (lambda v: (isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items())), "an object of strings"),
}
_PARITY = {"max_abs": _OPT_NUM, "max_rel": _OPT_NUM, "atol": _OPT_NUM, "rtol": _OPT_NUM, "noise": _OPT_OBJ,
           "shapes": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
                      "a list of objects")}
_LATENCY = {**{k: _OPT_NUM for k in ("median", "p90", "min", "mean", "iqr", "cv", "spread")},
            "iterations": _OPT_INT, "threads": _OPT_INT,
            "unstable": (lambda v: v is None or isinstance(v, bool), "a boolean or null"),
            "loaded": (lambda v: v is None or isinstance(v, bool), "a boolean or null"),
            "bimodal": (lambda v: v is None or isinstance(v, bool), "a boolean or null"),
            "unstable_why": _OPT_STR, "same_file_as": _OPT_STR,
            "load": _OPT_OBJ,
            **{k: (_numbers, "a list of numbers") for k in ("processes", "modes", "samples")}}


_BLAME = {"party": _STR, "reason": _OPT_STR, "repository": _OPT_STR, "source": _OPT_STR,
          "divergence": _OPT_OBJ, "seconds": _OPT_NUM,
          "evidence": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
                       "a list of objects")}


def _check(data: dict[str, Any], spec: dict[str, tuple], prefix: str = "") -> None:
    for key, (ok, expected) in spec.items():
        if key in data and not ok(data[key]):
            raise RecordError(f"'{prefix}{key}' must be {expected} (got {_short(data[key])})")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _validate(data: dict[str, Any]) -> None:
    """Raise RecordError unless ``data`` (migrated) has what every reader relies on."""
    for key, (ok, expected) in _REQUIRED.items():
        if key not in data:
            raise RecordError(f"'{key}' is missing")
        if not ok(data[key]):
            raise RecordError(f"'{key}' must be {expected} (got {_short(data[key])})")
    if data.get("status") not in {s.value for s in Status}:
        raise RecordError(f"'status' must be one of {', '.join(s.value for s in Status)} "
                          f"(got {_short(data.get('status'))})")
    _check(data, _OPTIONAL)
    if isinstance(data.get("parity"), dict):
        _check(data["parity"], _PARITY, "parity.")
    if isinstance(data.get("latency_ms"), dict):
        _check(data["latency_ms"], _LATENCY, "latency_ms.")
    if isinstance(data.get("blame"), dict):
        _check(data["blame"], _BLAME, "blame.")
    for key in ("options", "parity", "latency_ms", "versions", "duration_s", "graph", "notes", "case_files", "blame"):
        if data.get(key) is None:
            data.pop(key, None)   # null means "absent": the dataclass default
    if not data.get("cell_id"):
        # A cell's id is a function of its key (records written without one, by hand or by tests).
        key = CellKey(data["case"], data["exporter"], data["opset"], data["runtime"],
                      ExportOptions.from_dict(data.get("options")))
        data["cell_id"] = key.cell_id(data["torch"])


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record up to the current schema; refuse newer ones."""
    version = data.get("schema", 0)
    if not _is_int(version):
        raise RecordError(f"'schema' must be an integer (got {_short(version)})")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"record has schema {version} but this harness reads up to {SCHEMA_VERSION}: "
            "upgrade the harness to read these results"
        )
    if version == 0:
        # Schema 0 (pre-release): 'result' instead of 'status', 'latency' instead of 'latency_ms'.
        if "result" in data and "status" not in data:
            data["status"] = data.pop("result")
        if "latency" in data and "latency_ms" not in data:
            data["latency_ms"] = data.pop("latency")
        data["schema"] = 1
    return data


def cut_torn_tail(path: Path, warn: Callable[[str], None] | None = None) -> int | None:
    """Cut a last line that lacks its newline (a write interrupted by a kill); report it through
    ``warn`` (default: stderr) naming the file and byte offset. Returns that offset, or None."""
    path = Path(path)
    try:
        fh = open(path, "r+b")
    except FileNotFoundError:
        return None
    with fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return None
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        # Walk back to the last newline; the bytes after it are the torn line.
        pos, start = size, 0
        while pos > 0:
            step = min(65536, pos)
            fh.seek(pos - step)
            chunk = fh.read(step)
            i = chunk.rfind(b"\n")
            if i >= 0:
                start = pos - step + i + 1
                break
            pos -= step
        fh.seek(start)
        if _parses(fh.read()):
            fh.write(b"\n")   # a whole record that only lacks its newline (an edited file): keep it
            fh.flush()
            os.fsync(fh.fileno())
            return None
        fh.truncate(start)
        fh.flush()
        os.fsync(fh.fileno())
    (warn or _stderr)(f"warning: {path}: cut a torn last line at byte {start} ({size - start} bytes "
                      "without a newline, left by an interrupted write)")
    return start


def _parses(raw: bytes) -> bool:
    try:
        Record.from_dict(json.loads(raw))
    except (ValueError, UnicodeDecodeError):   # RecordError and SchemaError are ValueErrors
        return False
    return True


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def append_record(path: Path, record: Record) -> None:
    """Append one record and make it durable before returning (an interrupted run keeps it).

    The line goes after a newline only: a torn tail is cut (and reported) first, so an appended
    record is never glued onto the bytes of an interrupted one. One ``write`` of the whole line
    on an O_APPEND descriptor."""
    append_records(path, [record])


def append_records(path: Path, records: Iterable[Record]) -> None:
    """Append records that are all known at once (cells taken from the store, skips) with one
    write and one fsync; the same guarantees as ``append_record`` (an interrupted write leaves a
    torn last line, which the next append or a resume cuts)."""
    path = Path(path)
    data = "".join(r.to_json() + "\n" for r in records)
    if not data:
        return
    cut_torn_tail(path)
    line = data.encode("utf-8", ENCODE_ERRORS)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: Path, warn: Callable[[str], None] | None = None) -> list[Record]:
    return list(iter_records(path, warn))


def iter_records(path: Path, warn: Callable[[str], None] | None = None) -> Iterator[Record]:
    """Every record of a results file, validated; ``RecordError`` (file:line and why) for a bad
    line or a cell id recorded twice. A torn last line is reported through ``warn`` (default:
    stderr) and skipped: it is what an interrupted write leaves, and resuming cuts it."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, "rb") as fh:
        yield from _records_in(path, fh, warn)


# Lines this process read before, by a digest of their bytes: the record each holds, pickled.
# One command reads a finished run's results.jsonl in several passes (remedies, finalising, the
# store's index, the reports, the summary), and the passes between them rewrite it (sorted, a
# remedy added to a few records): a line read before is not parsed and validated again, and
# every read gets records of its own (callers change them).
_LINES: OrderedDict[bytes, bytes] = OrderedDict()
_LINES_KEEP_BYTES = 64 << 20
_LINES_LOCK = threading.Lock()
_lines_bytes = 0


def _record_of(raw: bytes, where: str) -> Record:
    global _lines_bytes
    digest = hashlib.blake2b(raw, digest_size=20).digest()
    with _LINES_LOCK:
        kept = _LINES.get(digest)
        if kept is not None:
            _LINES.move_to_end(digest)
    if kept is not None:
        return pickle.loads(kept)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"not valid JSON ({exc})", where) from None
    try:
        rec = Record.from_dict(data)
    except RecordError as exc:
        raise exc.at(where) from None
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from None
    pickled = pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL)
    with _LINES_LOCK:
        if digest not in _LINES:
            _LINES[digest] = pickled
            _lines_bytes += len(pickled)
        while _lines_bytes > _LINES_KEEP_BYTES:
            _lines_bytes -= len(_LINES.popitem(last=False)[1])
    return rec


def _records_in(path: Path, lines: Iterable[bytes], warn: Callable[[str], None] | None) -> Iterator[Record]:
    seen: dict[str, int] = {}
    offset = 0
    for lineno, raw in enumerate(lines, 1):
        start, offset = offset, offset + len(raw)
        where = f"{path}:{lineno}"
        if not raw.endswith(b"\n") and not _parses(raw):
            (warn or _stderr)(f"warning: {path}: torn last line at byte {start} ({len(raw)} bytes "
                              "without a newline, left by an interrupted write): not read")
            return
        if not raw.strip():
            continue
        rec = _record_of(raw, where)
        if rec.cell_id in seen:
            raise RecordError(f"cell {rec.cell_id} is recorded twice (first at line "
                              f"{seen[rec.cell_id]})", where)
        seen[rec.cell_id] = lineno
        yield rec


def count_by_status(records: Iterable[Record]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for rec in records:
        counts[rec.status.value] += 1
    return counts


def layer_change(base: Record | None, cand: Record | None) -> str | None:
    """'blamed layer moved: A (repo) → B (repo)' when both sides failed with a blamed layer and
    the layers differ; None otherwise (records before layers existed say nothing)."""
    sides = [r.blame if r is not None and r.status.is_failure else None for r in (base, cand)]
    if any(b is None or not b.layer for b in sides) or sides[0].layer == sides[1].layer:
        return None
    text = [f"{b.layer} ({b.repository or MODEL_OWNER})" for b in sides]
    return f"blamed layer moved: {text[0]} → {text[1]}"
