"""The spool between the phases of a run: the verdict phase keeps each passing group's exported
file in ``<run_dir>/spool/<gid>/`` with its example-shape feeds, every shape its cells ran
(TensorRT builds its profile from them), the torch version and, for the runtime-only
environments, eager's outputs and the case's tolerances; the latency phase, the runtime releases
(``harness.worker.runtime_only.release_check``) and the interleaved timing read it back.

File names: ``harness.core.wire``. Standard library at module level, numpy lazily: a runtime-only
environment (no torch) imports this.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import short_error
from harness.core.wire import SPOOL_EXPECTED, SPOOL_FEEDS, SPOOL_META


@dataclass
class SpooledFile:
    """A spool folder read back: the exported file, its example-shape feeds (input name → array),
    every input shape its cells ran, and ``spool.json``; ``error``: why it could not be read."""

    onnx: Path
    feeds: dict[str, Any] = field(default_factory=dict)
    shapes: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None

    @property
    def torch(self) -> str:
        return str(self.meta.get("torch", ""))

    def expected(self) -> list[Any]:
        """Eager's outputs at the example shape (kept for the runtime-only environments)."""
        import numpy as np

        with np.load(self.onnx.parent / SPOOL_EXPECTED) as data:
            return [data[f"arr_{i}"] for i in range(self.meta["outputs"])]


def read_spooled(spool: Path) -> SpooledFile:
    """The file and feeds of a spool folder (as ``write_spool`` writes it); raises when unreadable."""
    import numpy as np

    meta = json.loads((spool / SPOOL_META).read_text())
    with np.load(spool / SPOOL_FEEDS) as data:
        feeds = {n: data[f"arr_{i}"] for i, n in enumerate(meta["inputs"])}
    shapes = [{n: tuple(d) for n, d in s.items()} for s in meta.get("shapes") or []]
    return SpooledFile(spool / meta["onnx"], feeds, shapes or [{n: tuple(v.shape) for n, v in feeds.items()}], meta)


def read_group_spool(spool: Path, gid: str) -> SpooledFile:
    """A group's spool for the latency phase: a missing or damaged one is each cell's failure
    (``error``), never the worker's."""
    folder = spool / gid
    try:
        return read_spooled(folder)
    except Exception as exc:  # noqa: BLE001 - a missing or damaged spool is each cell's failure
        return SpooledFile(folder / f"{gid}.onnx",
                           error=FileNotFoundError(f"spooled export of {gid} unreadable: {short_error(exc)}"))


def write_spool(folder: Path, onnx_name: str, feeds: dict[str, Any], shapes: list[dict[str, Any]] | None = None,
                expected: list[Any] | None = None, **meta: Any) -> Path:
    """Write the feeds, eager's outputs (``expected``) and ``spool.json`` beside an exported file
    already in ``folder``."""
    import numpy as np

    names = list(feeds)
    np.savez(folder / SPOOL_FEEDS, *[feeds[n] for n in names])
    if expected is not None:
        np.savez(folder / SPOOL_EXPECTED, *[np.asarray(a) for a in expected])
        meta["outputs"] = len(expected)
    shapes = shapes or [{n: list(np.shape(v)) for n, v in feeds.items()}]
    (folder / SPOOL_META).write_text(json.dumps({"onnx": onnx_name, "inputs": names, "shapes": shapes, **meta}))
    return folder
