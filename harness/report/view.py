"""Look at a cell's graph: its bundle's ``model.onnx`` (or ``reduced.onnx``) in Netron.

Netron serves the file on a local port; with a browser at hand it opens it, otherwise (CI, a
remote shell) it prints the address to open. The server runs until interrupted.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import webbrowser
from pathlib import Path
from typing import Any

from harness.core.record import Record
from harness.matrix.rules import ConfigError
from harness.store.runs import load_run, resolve_run


def find_record(records: list[Record], cell: str) -> Record:
    """The record ``cell`` names: a cell id, or its key without the torch part when that is unique."""
    exact = [r for r in records if r.cell_id == cell]
    if exact:
        return exact[0]
    wanted = re.sub(r"^torch[^-]*-", "", cell)
    loose = [r for r in records if re.sub(r"^torch[^-]*-", "", r.cell_id) == wanted]
    if len(loose) == 1:
        return loose[0]
    if loose:
        raise ConfigError(f"cell {cell!r} matches {len(loose)} cells ({', '.join(r.cell_id for r in loose)}): "
                          "give the full cell id")
    raise ConfigError(f"no cell {cell!r} in this run")


def model_file(run_dir: Path, rec: Record, reduced: bool = False) -> Path:
    """The file to show; ConfigError (exit 2) with the reason when there is none."""
    from harness.run.post.reduction import bundle_dir

    if not rec.bundle:
        raise ConfigError(f"cell {rec.cell_id} ({rec.status.value}) has no bundle: bundles are written "
                          "for failing cells")
    folder = bundle_dir(run_dir, rec)
    name = "reduced.onnx" if reduced else "model.onnx"
    if folder is not None and (folder / name).exists():
        return folder / name
    if reduced:
        raise ConfigError(f"cell {rec.cell_id} has no reduced.onnx: run `python -m harness reduce "
                          f"{Path(run_dir).name} --cell {rec.cell_id}` first")
    raise ConfigError(f"cell {rec.cell_id}: no model.onnx in its bundle (moved, or the export failed "
                      "before a file existed)")


def can_browse() -> bool:
    """A browser can be opened here: not CI, a display or a known browser."""
    if os.environ.get("CI"):
        return False
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return bool(os.environ.get("BROWSER"))
    try:
        webbrowser.get()
        return True
    except webbrowser.Error:
        return False


def serve(path: Path, browse: bool, port: int | None = None) -> Any:
    """Start Netron on ``path``; returns its (host, port)."""
    import netron

    return netron.start(str(path), address=port, browse=browse)


def view_cell(cell: str, run: str, reports: Path, reduced: bool = False, browse: bool | None = None,
              port: int | None = None, wait: bool = True) -> int:
    run_dir = resolve_run(run, reports)
    _, records = load_run(run_dir)
    rec = find_record(records, cell)
    path = model_file(run_dir, rec, reduced)
    if shutil.which("netron") is None:
        try:
            import netron
        except ImportError:
            raise ConfigError("netron is not installed: pip install netron") from None
    address = serve(path, browse if browse is not None else can_browse(), port)
    host, bound = address if isinstance(address, tuple) else ("localhost", address)
    print(f"{rec.cell_id}: {path}")
    print(f"Netron: http://{host}:{bound}  (Ctrl-C to stop)", flush=True)
    if wait:
        import netron

        try:
            netron.wait()
        except KeyboardInterrupt:
            netron.stop()
    return 0
