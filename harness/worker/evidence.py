"""Evidence once per file: the blame ladder's file-only rungs (the ONNX reference evaluator, ONNX
Runtime with optimisations off and at default) and the divergence search, computed once per
exported file and the same inputs, and shared by every runtime cell of that file.

Within one group, the blame ladder keeps them on the group's context (``ctx._blame_rungs``,
``ctx.divergences``). Across the groups one worker runs, the same file often comes back: the
opsets of a dynamo export family write one file where torch keeps its native opset (each group in
a process of its own, forked from the family's). ``shared`` keeps the evidence on disk in the
worker's scratch folder, keyed by the file's digest and everything else the rungs read (feeds,
eager references, tolerances, the model's noise floors), and hands it to the next group of the
same key before its ladder runs. Worker side: standard library at module level.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import traceback
from pathlib import Path
from typing import Any, Iterator


def _arrays(h: "hashlib._Hash", values: Any) -> None:
    """Feed nested lists / dicts of arrays (and plain values) into ``h``, in order."""
    if isinstance(values, dict):
        for k in sorted(values):
            h.update(str(k).encode())
            _arrays(h, values[k])
    elif isinstance(values, (list, tuple)):
        h.update(b"[")
        for v in values:
            _arrays(h, v)
        h.update(b"]")
    elif hasattr(values, "tobytes") and hasattr(values, "dtype"):
        h.update(f"{values.dtype}{getattr(values, 'shape', '')}".encode())
        h.update(values.tobytes())
    else:
        h.update(repr(values).encode())


def values_digest(values: Any) -> str:
    """sha256 of nested lists / dicts of arrays and plain values, the first 24 hex digits."""
    h = hashlib.sha256()
    _arrays(h, values)
    return h.hexdigest()[:24]


def evidence_key(ctx: Any, digest: str) -> str:
    """What the file-only evidence of a group depends on: its file and the inputs it is judged by."""
    h = hashlib.sha256(digest.encode())
    _arrays(h, [ctx.feeds, ctx.references, ctx.spec.atol, ctx.spec.rtol])
    floors = getattr(ctx, "floors", None)
    if floors is not None:
        _arrays(h, [floors(i) for i in range(len(ctx.references))])
    return h.hexdigest()[:24]


def _stat_key(path: Path) -> tuple:
    # The key the blame ladder checks its group cache against (blame._shared_rungs).
    stat = path.stat()
    return (str(path), stat.st_mtime_ns, stat.st_size)


@contextlib.contextmanager
def shared(ctx: Any, folder: Path | None) -> Iterator[None]:
    """Around a group's cells: evidence another group left for the same file and inputs is
    taken before the ladder runs; what this group computed is left for the next."""
    path = _path(ctx, folder)
    if path is not None and path.exists() and getattr(ctx, "_blame_rungs", None) is None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ctx._blame_rungs = (_stat_key(ctx.onnx_path), data["rungs"])
            ctx.divergences.update({int(k): v for k, v in (data.get("divergence") or {}).items()})
        except Exception:  # noqa: BLE001 - the ladder computes them itself
            traceback.print_exc()
    try:
        yield
    finally:
        rungs = getattr(ctx, "_blame_rungs", None)
        if path is not None and rungs is not None:
            _write(path, {"rungs": rungs[1], "divergence": {str(k): v for k, v in ctx.divergences.items()}})


def _path(ctx: Any, folder: Path | None) -> Path | None:
    digest = (getattr(ctx, "made", None) or {}).get("sha256")
    if folder is None or not digest or getattr(ctx, "failure", None) is not None or ctx.spec is None:
        return None
    try:
        return folder / f"{evidence_key(ctx, digest)}.json"
    except Exception:  # noqa: BLE001 - inputs that do not hash: this group computes its own
        traceback.print_exc()
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        traceback.print_exc()
