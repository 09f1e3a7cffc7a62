"""The report's optional passes that could not be made (harness.core.passes): one row per pass and
reason, at the top of matrix.md and matrix.html, so a run whose runtime floors, deploy check,
reductions, blame or bundles are missing says so where it is read, and the terminal summary.

Drawn from the records (``Record.passes_not_run``) and their joined reductions, the same facts
run.json's ``passes_not_run`` was gathered from when the run was finalized (a later ``harness
reduce`` shows here too); a run without any renders as before.
"""
from __future__ import annotations

from typing import Any, Iterable

from tabulate import tabulate

from harness.core.passes import PassGap, gather
from harness.core.record import Record
from harness.report.text import md_code, md_text

INTRO = ("Optional passes this run was asked for could not be made for some cells: their results "
         "are missing, not passing.")


def run_gaps(records: Iterable[Record]) -> list[PassGap]:
    records = list(records)
    reductions = {r.cell_id: r.graph["reduced"] for r in records
                  if isinstance((r.graph or {}).get("reduced"), dict)}
    return gather(records, reductions)


def summary_lines(records: Iterable[Record]) -> list[str]:
    """Lines for the terminal: one per pass and reason."""
    gaps = run_gaps(records)
    if not gaps:
        return []
    return [f"passes not made ({len(gaps)}):"] + [f"  {g.line()}"[:400] for g in gaps]


def markdown_section(records: Iterable[Record]) -> str:
    gaps = run_gaps(records)
    if not gaps:
        return ""
    table = tabulate([[md_code(g.name), g.cells, md_text(g.reason, 300), ", ".join(md_code(c) for c in g.examples)]
                      for g in gaps], headers=["optional pass", "cells", "why", "cells (first)"], tablefmt="github")
    return f"## Passes not made\n\n⚠️ {INTRO}\n\n{table}\n\n"


def html_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    return [{"name": g.name, "cells": g.cells, "reason": g.reason, "examples": g.examples}
            for g in run_gaps(records)]
