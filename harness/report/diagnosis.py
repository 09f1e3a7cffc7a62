"""The report's diagnosis parts: graph changes between torch versions, dims the exporter fixed,
smallest failing graphs, and each cell's bundle files.

Every part is drawn only from facts that older records lack (``graph.io``, ``graph.specialised``,
``graph.reduced``, a bundle folder on disk), so a run stored before them renders byte for byte as
it did: each function returns nothing for it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.core.record import Record
from harness.report.drift import export_key, export_name, previous_drift, run_drifts


def _cell(text: Any, limit: int = 200) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _verdict(rec: Record) -> str:
    return f"{rec.status.value} ({rec.stage})" if rec.stage else rec.status.value


def drift_rows(records: list[Record]) -> list[dict[str, Any]] | None:
    """Rows of the graph-changes table; None when no export has facts on two torch versions."""
    drifts = run_drifts(records)
    if not drifts:
        return None
    return [{"export": d.name, "torch": f"{d.drift.before} → {d.drift.after}",
             "changes": d.drift.summary(), "io": d.drift.io_changed}
            for d in drifts if d.drift.changed]


def specialised_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per export and torch version whose file fixed a dim the case declared dynamic."""
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        fixed = (rec.graph or {}).get("specialised")
        if not fixed:
            continue
        row = rows.setdefault((export_key(rec), rec.torch), {
            "export": export_name(rec), "torch": rec.torch,
            "fixed": "; ".join(f["note"] for f in fixed), "verdicts": []})
        row["verdicts"].append(f"{rec.runtime}: {_verdict(rec)}")
    return list(rows.values())


def reduced_rows(records: list[Record]) -> list[dict[str, Any]]:
    """Failing cells that went through `harness reduce`: the reduced graph or why there is none."""
    rows = []
    for rec in records:
        red = (rec.graph or {}).get("reduced")
        if not isinstance(red, dict):
            continue
        ops = red.get("ops") or {}
        rows.append({"cell": rec.cell_id, "stage": rec.stage or "", "reduced": bool(red.get("file")),
                     "nodes": (f"{red.get('original_nodes', '?')} → {red['nodes']}"
                               if red.get("nodes") is not None else "–"),
                     "ops": ", ".join(f"{op}×{n}" for op, n in ops.items()),
                     "detail": red.get("check") or red.get("note") or ""})
    return rows


def markdown_sections(records: list[Record]) -> str:
    """The diagnosis sections of matrix.md ('' for a run without the facts)."""
    out = []
    rows = drift_rows(records)
    if rows is not None:
        body = (tabulate([[r["export"], r["torch"], _cell(r["changes"], 300)] for r in rows],
                         headers=["export", "torch", "changes"], tablefmt="github")
                if rows else "The exported graphs are the same across the torch versions of this run.")
        out.append(f"## Graph changes between torch versions\n\n{body}\n\n")
    rows = specialised_rows(records)
    if rows:
        table = tabulate([[r["export"], r["torch"], _cell(r["fixed"]), ", ".join(r["verdicts"])] for r in rows],
                         headers=["export", "torch", "fixed by the exporter", "verdict"], tablefmt="github")
        out.append("## Dims fixed by the exporter\n\nDims the case declared dynamic that the exported "
                   f"file fixes to the example's size:\n\n{table}\n\n")
    rows = reduced_rows(records)
    if rows:
        table = tabulate([[r["cell"], r["stage"], r["nodes"], _cell(r["ops"], 120), _cell(r["detail"], 160)]
                          for r in rows], headers=["cell", "stage", "nodes", "ops", "check"], tablefmt="github")
        out.append(f"## Smallest failing graphs\n\n{table}\n\n")
    return "".join(out)


def bundle_files(run_dir: Path, rec: Record) -> list[dict[str, Any]] | None:
    """The files of a cell's bundle with links relative to the run's matrix.html; None when the
    bundle folder is not on disk (moved, trimmed fixture, never written)."""
    if not rec.bundle:
        return None
    run_dir = Path(run_dir)
    recorded = Path(rec.bundle)
    for folder in (recorded if recorded.is_absolute() else run_dir / recorded, run_dir / "bundles" / recorded.name):
        if folder.is_dir():
            break
    else:
        return None
    # Relative to the page even outside the run (never a file: link, which pages do not hold).
    try:
        base = Path(os.path.relpath(folder.resolve(), run_dir.resolve())).as_posix() + "/"
    except ValueError:
        return None     # another drive: no relative link exists
    return [{"name": f.name, "href": base + f.name, "bytes": f.stat().st_size}
            for f in sorted(folder.iterdir()) if f.is_file()]


def cell_extras(run_dir: Path, records: list[Record]) -> dict[int, dict[str, Any]]:
    """Per record position, the details only newer records have (graph drift, bundle files)."""
    extras: dict[int, dict[str, Any]] = {}
    for i, drift in previous_drift(records).items():
        if drift.changed:
            extras.setdefault(i, {})["drift"] = drift.to_dict()
    for i, rec in enumerate(records):
        files = bundle_files(run_dir, rec)
        if files:
            extras.setdefault(i, {})["bundle_files"] = files
    return extras


def wants_details_script(records: list[Record], extras: dict[int, dict[str, Any]]) -> bool:
    """The extra details script is embedded only where it has something to show."""
    return bool(extras) or any(
        any(k in (rec.graph or {}) for k in ("io", "specialised", "reduced", "runtime_floor", "deploy",
                                             "runtime_versions")) for rec in records)
