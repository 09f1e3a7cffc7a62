"""What torch said while it exported: silent re-exports and specialised sizes, read from the
exporter's own logs and calls, with the model's source line that caused them.

torch 2.6's ``torch.onnx.export(dynamo=True)`` catches torch.export's "Constraints violated ...
past was inferred to be a constant (3)" and exports again with the suggested fix
(``refine_dynamic_shapes_from_suggested_fixes``), without a word; later releases raise it (a size
marked ``Dim.DYNAMIC`` that "your code specialized to be a constant"). ``ExportLog`` is a context
around one export that keeps, for the record:

- ``refined``: each suggested fix torch applied before exporting again (the message it read);
- ``events``: each size torch fixed to one value while tracing (``set_replacement sN = V
  (range_refined_to_singleton)`` in 2.6 and 2.9, ``eval Eq(sN, V) [guard added]`` in 2.13,
  logged by torch.fx's symbolic shapes at INFO) with the innermost frame of the model's own
  code on the stack at that moment;
- ``ignored``: the guards torch logged as ignored (``Ignored guard s0 == 2``): torch 2.6 then
  names the file's dim by that size ('2') and the dim stays dynamic in the file.

``facts(dims, inputs)`` turns them into records: which declared dim, which value, how (re-export,
or the export's failure), where in the model's source, and the remedy that fits. Nothing here
changes what the export does; torch's own messages still reach the log.

Worker side: standard library at module level, torch lazily.
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
from typing import Any, Iterator

from harness.worker.diagnose.onnx_reference import library_file

SHAPES_LOGGER = "torch.fx.experimental.symbolic_shapes"
_REPLACED = re.compile(r"set_replacement (s\d+) = (-?\d+) \(range_refined_to_singleton\)")
# torch 2.13: "eval Eq(s27, 6) [guard added] (tests/cases/dim_policy.py:20 in forward)"
_GUARD_EQ = re.compile(r"eval Eq\((s\d+), (-?\d+)\) \[guard added\]")
_CREATED = re.compile(r"create_symbol (s\d+) = (-?\d+) for (\S+)")
_IGNORED = re.compile(r"Ignored guard (.+?), this could result")
# "Not all values of past = L['args'][0][1].size()[2] ... past was inferred to be a constant (3)"
# (torch 2.6), "... satisfy the generated guard 6 <= L['x'].size()[1] and ..." (2.13), then
# "Suggested fixes:\n  past = 3": which Dim, on which input's axis, fixed to which value.
_VALUES_OF = re.compile(r"values of (\w+) = (\S+?)\.size\(\)\[(\d+)\]")
_FIXED_TO = re.compile(r"^\s*(\w+) = (-?\d+)\s*$", re.MULTILINE)
# "You marked L['past_key'].size()[2] as dynamic but your code specialized it to be a constant (3)"
_MARKED = re.compile(r"marked (\S+?)\.size\(\)\[(\d+)\] as dynamic but your code specialized it to be a "
                     r"constant \((-?\d+)\)")
# where torch says a guard was added: "(_ops.py:886 in decompose)", "(tests/cases/x.py:20 in forward)"
_AT = re.compile(r"\(([^()\s]+\.py:\d+) in \w+\)")
_SOURCE = re.compile(r"\[('?)([^\]']*)\1\]")


def user_frame() -> str | None:
    """'file.py:40: the line' of the innermost frame of the model's own code on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not library_file(path) and "/logging/" not in path.replace("\\", "/"):
            import linecache

            text = linecache.getline(path, frame.f_lineno).strip()
            return f"{path}:{frame.f_lineno}" + (f": {text}" if text else "")
        frame = frame.f_back
    return None


class ExportLog(logging.Handler):
    """A context around one export (``watching``), then its facts (``facts``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.refined: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.ignored: list[str] = []
        self.symbols: dict[str, str] = {}     # sN → torch's name of its size (L['x'].size()[2])

    # -- while exporting --------------------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a message torch could not format is not a fact
            return
        if m := _CREATED.search(text):
            self.symbols[m.group(1)] = m.group(3)
        elif m := (_REPLACED.search(text) or _GUARD_EQ.search(text)):
            self.events.append({"symbol": m.group(1), "value": int(m.group(2)),
                                "input": self.symbols.get(m.group(1)), "source": user_frame(),
                                "at": (a.group(1) if (a := _AT.search(text)) else None)})
        elif m := _IGNORED.search(text):
            self.ignored.append(m.group(1))
        if record.levelno >= logging.WARNING:
            print(f"{record.levelname[0]} {record.name}] {text}", file=sys.stderr)   # torch's own line

    @contextlib.contextmanager
    def watching(self) -> Iterator["ExportLog"]:
        """Listen to torch's symbolic-shapes logger at INFO (without printing its INFO lines) and
        to the suggested fixes torch.onnx applies, for the duration of one export."""
        logger = logging.getLogger(SHAPES_LOGGER)
        level, propagate = logger.level, logger.propagate
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        undo = self._patch_refine()
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)
            logger.propagate = propagate
            if undo is not None:
                undo()

    def _patch_refine(self):
        """Wrap torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes (what
        torch.onnx calls before a silent re-export); returns the undo, None where it is absent."""
        try:
            import torch.export.dynamic_shapes as ds
        except ImportError:
            return None
        original = getattr(ds, "refine_dynamic_shapes_from_suggested_fixes", None)
        if original is None:
            return None

        def refine(msg: Any, dynamic_shapes: Any) -> Any:
            self.refined.append(str(msg))
            return original(msg, dynamic_shapes)

        ds.refine_dynamic_shapes_from_suggested_fixes = refine
        return lambda: setattr(ds, "refine_dynamic_shapes_from_suggested_fixes", original)

    # -- afterwards -----------------------------------------------------------------------------
    def facts(self, inputs: Any, dims: dict[tuple, dict[int, str]],
              failure: BaseException | None = None) -> list[dict[str, Any]]:
        """One fact per declared dynamic dim torch fixed to one value: ``{dim, input, axis, value,
        how ("re-exported" | "export failed"), message, source, remedy}``. ``inputs``: the case's
        ``CaseInputs``; ``dims``: leaf key → {axis: dim name}; ``failure``: the export's exception."""
        leaves = {leaf.key: leaf for leaf in inputs.tensor_leaves()}
        found: dict[tuple[str, int], dict[str, Any]] = {}

        def add(source: str, axis: int, value: int, how: str, message: str) -> None:
            key = leaf_key(source, leaves)
            if key is None or axis not in dims.get(key, {}):
                return
            dim = dims[key][axis]
            found.setdefault((dim, value), {"dim": dim, "input": leaves[key].name, "axis": axis,
                                            "value": value, "how": how, "message": message.strip()[:300],
                                            "example": int(leaves[key].value.shape[axis])})

        for message in self.refined:
            fixes = {m.group(1): int(m.group(2)) for m in _FIXED_TO.finditer(message.split("Suggested fixes:", 1)[-1])}
            for m in _VALUES_OF.finditer(message):
                if m.group(1) in fixes:
                    line = next((ln for ln in message.splitlines() if m.group(0) in ln), m.group(0))
                    add(m.group(2), int(m.group(3)), fixes[m.group(1)], "re-exported", line.strip(" -"))
        if failure is not None:
            for m in _MARKED.finditer("\n".join(str(e) for e in _chain(failure))):
                add(m.group(1), int(m.group(2)), int(m.group(3)), "export failed", m.group(0))
        for fact in found.values():
            fact["source"] = self._source_of(fact)
            fact["remedy"] = remedy(fact)
        return list(found.values())

    def _source_of(self, fact: dict[str, Any]) -> str | None:
        """The model's line on the stack when torch fixed a symbol of that axis to that value."""
        same = [e for e in self.events if e["value"] == fact["value"] and e.get("source")]
        on_axis = [e for e in same if (e.get("input") or "").endswith(f".size()[{fact['axis']}]")]
        return (on_axis or same or [{}])[0].get("source")


def leaf_key(source: str, leaves: dict[tuple, Any]) -> tuple | None:
    """torch's name of an input (``L['args'][0][1]``, ``L['past_key']``, ``L['kwargs']['x']``)
    → the key of the case's input leaf it names (by position, or by the path users address it
    by), None when none matches."""
    parts = [int(p) if not quoted and p.lstrip("-").isdigit() else p for quoted, p in _SOURCE.findall(source)]
    if parts[:2] == ["args", 0]:
        parts = parts[2:]                  # torch.export's (args, kwargs) pair: the args tuple
    elif parts[:1] in (["args"], ["kwargs"]):
        parts = parts[1:]
    wanted = tuple(parts)
    path = ".".join(map(str, parts))
    for key, leaf in leaves.items():
        if tuple(key) == wanted or leaf.path == path:
            return key
    return None


def remedy(fact: dict[str, Any]) -> str:
    """What fits the way the size became a constant."""
    source = (fact.get("source") or "").lower()
    if fact["value"] in (0, 1) and fact.get("example") == fact["value"]:
        return (f"torch.export specialises example sizes 0 and 1: give an example with {fact['dim']} >= 2 "
                "(or the case's own second_inputs for the sizes it must also run at)")
    if "triu" in source or "tril" in source:
        return ("build the mask from arange comparisons (keys > queries + past) instead of "
                "triu/tril with a size as the diagonal, or export with a newer torch")
    return (f"the model turns {fact['dim']} into a Python number there: compute it with tensor ops, "
            "state what torch may assume with torch._check, or export with a newer torch")


def _chain(exc: BaseException) -> list[BaseException]:
    out, seen = [exc], {id(exc)}
    while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        out.append(nxt)
    return out
