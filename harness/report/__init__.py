"""Reports of stored runs: pandas aggregation (``aggregate``), ``matrix.md`` (``markdown``),
``matrix.html`` and the store's index and site (``html``), SVG plots (``plots``).

Takes ``Record``s and ``RunMeta`` from the store; never writes results.jsonl or run.json.
"""
from __future__ import annotations

from pathlib import Path


def render_run(run_dir: Path, reports: Path | None) -> Path:
    """(Re-)render every report file of one stored run; returns matrix.md's path."""
    from harness.report.html import write_reports
    from harness.store.runs import load_run

    meta, records = load_run(run_dir)
    return write_reports(Path(run_dir), records, meta, reports)
