"""The TracerWarnings torch emits while it exports (worker side): jit.trace (the TorchScript
exporter, and torch.onnx 2.6's silent fallback after torch.export refused a model) warns where it
turns a tensor's value into a Python constant, naming the source line. A value-freezing warning
on the model's own line is the evidence that the model's Python control flow or value was frozen
by tracing (a documented limitation); one on torch's own line is not the model's doing.

``tracer_warnings()`` is a context around one export; the warnings still reach the cell's log.
Standard library at module level; torch lazily.
"""
from __future__ import annotations

import contextlib
import linecache
import re
import warnings
from typing import Any, Iterator

from harness.worker.diagnose.onnx_reference import model_file

# The kinds that freeze a value (a branch taken, a size or a scalar recorded as a constant);
# "Iterating over a tensor" and the shape-check warnings freeze nothing by themselves.
VALUE_FREEZING = re.compile(
    r"Converting a tensor to a Python (boolean|integer|index|float|number)|"
    r"torch\.tensor results are registered as constants|Converting a tensor to a NumPy array", re.I)


@contextlib.contextmanager
def tracer_warnings() -> Iterator[list[dict[str, Any]]]:
    """Yield the list the export's TracerWarnings are added to: ``{message, source, model,
    freezes}`` (``model``: the line is the model's own; ``freezes``: a value-freezing kind)."""
    found: list[dict[str, Any]] = []
    try:
        from torch.jit import TracerWarning
    except ImportError:
        yield found
        return
    caught: list[Any] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            # "always": a long-lived worker has seen the same warning in an earlier group
            warnings.simplefilter("always", TracerWarning)
            yield found
    finally:
        for w in caught:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)   # still in the cell's log
            if not issubclass(w.category, TracerWarning):
                continue
            text = linecache.getline(w.filename, w.lineno).strip()
            found.append({"message": str(w.message).splitlines()[0][:200],
                          "source": f"{w.filename}:{w.lineno}" + (f": {text}" if text else ""),
                          "model": model_file(w.filename),
                          "freezes": VALUE_FREEZING.search(str(w.message)) is not None})


def model_freezes(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The value-freezing warnings on the model's own lines."""
    return [w for w in found if w.get("model") and w.get("freezes")]
