"""Capture once per model, torch release and options; translate per opset.

``torch.onnx.export(model, ..., dynamo=True)`` first captures the model with ``torch.export``
(the same for every opset: the opset only enters at translation), then decomposes the exported
program and translates it to ONNX with torchlib's registry, then converts the model to the asked
opset and optimises it. The registry is built at ``max(opset, torchlib's own opset)`` (18 in the
releases of the default matrix), so opsets 13, 17 and 18 are *translated* the same way too, and
only the conversion and what follows differ. The opsets of one export *family* (the groups
sharing case, exporter and options: ``ExportGroup.capture_key``) therefore share the capture and,
where their registries are at one opset, the decomposition and translation: the family's process
builds the case, computes its references, captures and translates once (``capture``); each
opset's group then runs in a process forked from it (so each has its own copy of the translated
model to convert) and calls ``torch.onnx.export(exported_program, ...)`` (``export_kwargs``),
torch's own continuation of the same call, in which the decomposition and translation return
what the family's process made for a registry at the same opset (``continuing``).

Only where that writes the file a per-opset call writes (graph, initializers, opset imports,
metadata: byte for byte) is the capture reused: ``PROVEN`` names the torch releases the proof
(tests/worker/test_capture_reuse.py, ``python -m harness.worker.capture_reuse``) compared on the
default matrix's cases. Elsewhere, and whenever the capture did not succeed at torch's first
strategy, each group exports on its own as before; the record says which (``Record.export_made``).

Worker side: standard library at module level, torch lazily.
"""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from harness.core.wire import CAPTURE_REUSE_ENV

REUSED, PER_OPSET = "reused-capture", "per-opset"

# torch releases (major, minor) where torch.onnx.export(exported_program, opset_version=N) writes
# the same bytes as torch.onnx.export(model, opset_version=N), shown by the proof on every case of
# the default matrix (matrix.yaml: 2.6, 2.9, 2.13) at opsets 13, 17, 18.
PROVEN: frozenset[tuple[int, int]] = frozenset({(2, 6), (2, 9), (2, 13)})


# Where the release builds torchlib's registry at the asked opset when that is above torchlib's
# own (2.9 and later), rather than always at torchlib's (2.6): groups whose registries are at two
# opsets decompose and translate differently, so they are two families (``by_registry``).
REGISTRY_FOLLOWS_OPSET: dict[tuple[int, int], bool] = {(2, 6): False, (2, 9): True, (2, 13): True}
TORCHLIB_OPSET = 18   # torchlib's own opset in the releases of PROVEN


def registry_opset(torch_version: str, opset: int) -> int:
    """The opset torch.onnx builds its registry at for an export at ``opset``: the registry, and
    so the decomposition and translation, is the same for every opset that maps to one value."""
    follows = REGISTRY_FOLLOWS_OPSET.get(_release(torch_version), True)
    return opset if follows and opset > TORCHLIB_OPSET else TORCHLIB_OPSET


def by_registry(torch_version: str, family: list[Any]) -> list[list[Any]]:
    """A family's groups split where their registries differ (``registry_opset``), in order."""
    out: dict[int, list[Any]] = {}
    for group in family:
        out.setdefault(registry_opset(torch_version, group.opset), []).append(group)
    return list(out.values())


def enabled() -> bool:
    """The switch: ``HARNESS_CAPTURE_REUSE=0`` exports every group on its own (the proof and the
    bench compare both ways)."""
    return os.environ.get(CAPTURE_REUSE_ENV, "1") != "0"


def _release(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def refusal(exporter: str, options: Any, torch_version: str, groups: int, forking: bool,
            determinism: bool = False) -> str | None:
    """Why a family's groups export per opset (None: the capture is shared)."""
    if exporter != "dynamo":
        return f"the {exporter} exporter has no capture to share"
    if groups < 2:
        return "one opset of this case, release and options in this worker"
    if not enabled():
        return f"capture reuse turned off ({CAPTURE_REUSE_ENV}=0)"
    if not forking:
        return "groups run in the worker itself (no fresh process per opset to share a capture with)"
    if determinism:
        return "the determinism check exports each group afresh"
    if _release(torch_version) not in PROVEN:
        return f"torch {torch_version} is not among the releases shown to write the same files"
    # The proof covers the default export options (those of the default matrix); a family
    # asking for another value of any option exports per opset.
    given, default = options.to_dict(), type(options)().to_dict()
    changed = sorted(k for k in set(given) | set(default) if given.get(k) != default.get(k))
    if changed:
        return (f"options {', '.join(f'{k}={given.get(k)!r}' for k in changed)} are not among those "
                "shown to write the same files")
    return None


class _Captured(BaseException):
    """Raised from inside torch's strategy loop once a capture succeeded: ends the export there.
    A BaseException, so that no ``except Exception`` of torch's turns it into an export error."""

    def __init__(self, result: Any) -> None:
        super().__init__("captured")
        self.result = result


class _Translated(BaseException):
    """Raised once torch's translation returned: ends the family's export there."""

    def __init__(self, translation: "Translation") -> None:
        super().__init__("translated")
        self.translation = translation


@dataclass
class Translation:
    """The family's decomposed program and translated ONNX program, for a registry at ``opset``:
    what the export of any group whose registry is at the same opset would compute again."""

    opset: int
    decomposed: Any
    onnx_program: Any
    seconds: float = 0.0


@dataclass
class Capture:
    """A family's shared capture: torch's exported program and the strategy that made it, or why
    there is none (then each group exports on its own); and, where the release's exporter has
    the steps to share, its translation (None: each group translates from the capture)."""

    program: Any = None
    strategy: str | None = None
    reason: str | None = None
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)
    translation: Translation | None = None
    translation_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.program is not None


def _exporter_core() -> Any:
    """torch.onnx's ``_core`` module where it has the two steps a family shares (decomposition,
    translation) under the names this module wraps; None elsewhere."""
    try:
        from torch.onnx._internal.exporter import _core
    except ImportError:
        return None
    steps = ("_prepare_exported_program_for_export", "_exported_program_to_onnx_program")
    return _core if all(callable(getattr(_core, name, None)) for name in steps) else None


def _registry_opset(kwargs: dict[str, Any]) -> int | None:
    return getattr(kwargs.get("registry"), "opset_version", None)


def capture(call: Callable[[], Any]) -> Capture:
    """Run ``call`` (the family's own ``torch.onnx.export(model, ...)``) up to the end of torch's
    translation and keep the exported program and the translation: each capture strategy's result
    is watched, and the translation's return ends the call. Torch's strategy loop, argument
    handling, decomposition and translation are its own.

    No program (the capture failed, or was not torch's first strategy, or this torch has no such
    loop, or the decomposition or translation after it failed): the groups export per opset and
    fail, or pass, exactly as before. A program but no translation (this torch names its steps
    otherwise: the call ended at the capture, the program untouched): the groups translate the
    shared capture themselves, as a per-opset call would."""
    import time

    try:
        from torch.onnx._internal.exporter import _capture_strategies as strategies
    except ImportError:
        return Capture(reason="this torch.onnx has no capture strategies to watch")
    first = strategies.CAPTURE_STRATEGIES[0] if strategies.CAPTURE_STRATEGIES else None
    original = strategies.CaptureStrategy.__call__
    core = _exporter_core()
    translate_original = core._exported_program_to_onnx_program if core is not None else None
    tried: list[str] = []
    captured: list[Any] = []
    marks: dict[str, float] = {}

    def watched(self, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        tried.append(type(self).__name__)
        if getattr(result, "exported_program", None) is not None:
            marks["captured"] = time.perf_counter()
            if core is None:
                raise _Captured(result)
            captured.append(result)
        return result

    def translating(exported_program: Any, *args: Any, **kwargs: Any) -> Any:
        onnx_program = translate_original(exported_program, *args, **kwargs)
        opset = _registry_opset(kwargs)
        if opset is None or args:
            return onnx_program     # called otherwise than this module knows: nothing shared
        raise _Translated(Translation(opset, exported_program, onnx_program,
                                      time.perf_counter() - marks.get("captured", t0)))

    def outcome(result: Any, translation: Translation | None, why: str | None) -> Capture:
        seconds = marks.get("captured", time.perf_counter()) - t0
        if first is None or tried != [first.__name__]:
            return Capture(reason=f"the capture needed torch's fallback strategies ({', '.join(tried)})",
                           seconds=seconds)
        return Capture(program=result.exported_program, strategy=getattr(result, "strategy", None),
                       seconds=seconds, translation=translation, translation_reason=why)

    t0 = time.perf_counter()
    strategies.CaptureStrategy.__call__ = watched
    if core is not None:
        core._exported_program_to_onnx_program = translating
    try:
        call()
    except _Captured as done:
        return outcome(done.result, None, "this torch.onnx names its decomposition and translation otherwise")
    except _Translated as done:
        return outcome(captured[-1], done.translation, None)
    except Exception as exc:  # noqa: BLE001 - each group exports on its own and meets it as its verdict
        if captured:
            # Captured, then the decomposition or translation failed. The program has been
            # through a decomposition, which leaves its shape environment changed (a second one
            # can fail otherwise: torch 2.6's repeat_interleave), so nothing of it is shared.
            return Capture(reason=f"the family's decomposition or translation failed ({type(exc).__name__}); "
                                  "each opset exports on its own", seconds=time.perf_counter() - t0)
        return Capture(reason=f"the capture failed ({type(exc).__name__}); each opset exports on its own",
                       seconds=time.perf_counter() - t0)
    finally:
        strategies.CaptureStrategy.__call__ = original
        if core is not None:
            core._exported_program_to_onnx_program = translate_original
    if captured:   # the export went past the translation unwatched: the program is not pristine
        return Capture(reason="torch.onnx.export returned without translating through the wrapped step",
                       seconds=time.perf_counter() - t0)
    return Capture(reason="torch.onnx.export returned without capturing through its strategies")


@contextlib.contextmanager
def continuing(capture: Capture) -> Iterator[dict[str, Any]]:
    """Around a group's ``torch.onnx.export(capture.program, ...)`` (in its own forked process):
    torch's decomposition and translation return the family's, where the call's registry is at
    the opset the family translated for; anything else runs torch's own (a family holds one
    registry's groups, ``by_registry``, so that is a release this module does not know). Yields
    what happened (``{"translation": "shared" | "own"}``)."""
    said: dict[str, Any] = {}
    core = _exporter_core()
    shared = capture.translation
    if core is None or shared is None:
        said["translation"] = "own"
        yield said
        return
    decompose, translate = core._prepare_exported_program_for_export, core._exported_program_to_onnx_program

    def decomposing(exported_program: Any, *args: Any, **kwargs: Any) -> Any:
        if exported_program is capture.program and not args and _registry_opset(kwargs) == shared.opset:
            return shared.decomposed
        return decompose(exported_program, *args, **kwargs)

    def translating(exported_program: Any, *args: Any, **kwargs: Any) -> Any:
        if exported_program is shared.decomposed and not args and _registry_opset(kwargs) == shared.opset:
            said["translation"] = "shared"
            return shared.onnx_program
        said["translation"] = "own"
        return translate(exported_program, *args, **kwargs)

    core._prepare_exported_program_for_export, core._exported_program_to_onnx_program = decomposing, translating
    try:
        yield said
    finally:
        core._prepare_exported_program_for_export, core._exported_program_to_onnx_program = decompose, translate


# What torch.onnx.export reads of a module call that the exported program already holds.
_CAPTURE_ONLY = ("kwargs", "dynamic_shapes", "dynamic_axes")


def export_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``torch.onnx.export(exported_program, (), path, ...)`` for one
    opset, from those of the module call: the same, less what only the capture reads."""
    return {k: v for k, v in kwargs.items() if k not in _CAPTURE_ONLY}


def made(capture: Capture | None, reason: str | None, shared_by: int = 1) -> dict[str, Any]:
    """The record's ``export_made``: how this group's file was made, and why not from a shared
    capture where it was not; after the export, ``translation`` says whether it went on from the
    family's translation ("shared") or translated the capture itself ("own")."""
    if capture is not None and capture.ok:
        made = {"how": REUSED, "shared_by": shared_by, "capture_s": round(capture.seconds, 3)}
        if capture.translation is not None:
            made["translate_s"] = round(capture.translation.seconds, 3)
        elif capture.translation_reason:
            made["own_translation_why"] = capture.translation_reason
        return made
    return {"how": PER_OPSET, "reason": reason or (capture.reason if capture is not None else None)}


def file_digest(path: Any) -> str | None:
    """sha256 of an exported file and its external data (``PATH.data``), the first 16 hex
    digits: the same digest means the same file, whichever way it was made."""
    import hashlib
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return None
    h = hashlib.sha256()
    for part in (path, path.with_name(path.name + ".data")):
        if part.exists():
            with open(part, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]
