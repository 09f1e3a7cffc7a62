"""The overview a reader takes in first: per runtime, a case × torch grid of how many of a case's
configurations (exporter, opset, options) passed, and the skips folded into one line per runtime
and reason. The flat matrix stays below it as the detail (its skip-only rows folded too)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.core.status import Status
from harness.report.aggregate import PASSED, sorted_torch
from harness.report.text import md_text

SKIP = Status.SKIP.value
KNOWN = (Status.XFAIL.value,)
# Not attempts: a skip, or a cell the matrix's own code failed on (counted on its own line).
NOT_RUN = (SKIP, Status.ERROR.value)


@dataclass
class GridCell:
    passed: int
    attempted: int
    known: int        # known failures (xfail) among the attempted

    @property
    def kind(self) -> str:
        """pass: every configuration passed; fail: none did; mixed: some did; xfail: only known ones failed."""
        if self.passed == self.attempted:
            return Status.PASS.value
        if self.passed + self.known == self.attempted:
            return Status.XFAIL.value
        return Status.FAIL.value if self.passed == 0 else "mixed"

    @property
    def text(self) -> str:
        return f"{self.passed}/{self.attempted}"


@dataclass
class Grid:
    runtime: str
    torches: list[str]
    rows: list[tuple[str, list[GridCell | None]]] = field(default_factory=list)


@dataclass
class SkipLine:
    runtime: str
    reason: str
    cells: int
    rows: int        # rows of the flat matrix (case, exporter, opset, options) that are skips only


@dataclass
class Overview:
    grids: list[Grid]
    skips: list[SkipLine]
    own_errors: int = 0      # cells the matrix's own code failed on: no verdict, counted apart


ROW = ["case", "exporter", "opset", "options", "runtime"]


def skip_only_rows(df: pd.DataFrame) -> pd.Series:
    """Per flat-matrix row (ROW), whether every one of its cells is a skip."""
    return df.groupby(ROW, sort=False)["status"].agg(lambda s: bool((s == SKIP).all()))


def build_overview(df: pd.DataFrame) -> Overview:
    torches = sorted_torch(df["torch"]) if not df.empty else []
    ran = df[~df["status"].isin(NOT_RUN)]
    # One pass over the cells: (runtime, case, torch) → [passed, attempted, known].
    tally: dict[tuple[Any, Any, Any], list[int]] = {}
    for runtime, case, t, status in zip(ran["runtime"], ran["case"], ran["torch"], ran["status"]):
        counts = tally.setdefault((runtime, case, t), [0, 0, 0])
        counts[0] += status in PASSED
        counts[1] += 1
        counts[2] += status in KNOWN
    grids = []
    for runtime in sorted({k[0] for k in tally}):
        present = {k[2] for k in tally if k[0] == runtime}
        grid = Grid(str(runtime), [t for t in torches if t in present])
        for case in sorted({k[1] for k in tally if k[0] == runtime}):
            cells = [None if (c := tally.get((runtime, case, t))) is None else GridCell(*c) for t in grid.torches]
            grid.rows.append((str(case), cells))
        grids.append(grid)
    skipped = df[df["status"] == SKIP].assign(reason=lambda d: d["reason"].fillna("no reason recorded"))
    only = skip_only_rows(df) if not df.empty else pd.Series(dtype=bool)
    lines = []
    for (runtime, reason), grp in skipped.groupby(["runtime", "reason"], sort=True):
        rows = {tuple(r) for r in grp[ROW].itertuples(index=False)}
        lines.append(SkipLine(str(runtime), str(reason), len(grp), sum(bool(only.get(r, False)) for r in rows)))
    return Overview(grids, lines, int((df["status"] == Status.ERROR.value).sum()) if not df.empty else 0)


def overview_context(df: pd.DataFrame) -> dict[str, Any]:
    """What run.html.j2's overview section draws."""
    ov = build_overview(df)
    return {"grids": [{"runtime": g.runtime, "torches": g.torches,
                       "rows": [{"case": case, "cells": [None if c is None else {"kind": c.kind, "text": c.text}
                                                         for c in cells]} for case, cells in g.rows]}
                      for g in ov.grids],
            "skips": [vars(s) for s in ov.skips], "own_errors": ov.own_errors}


GLYPH = {Status.PASS.value: "✅", Status.FAIL.value: "❌", "mixed": "◐", Status.XFAIL.value: "⚠️"}


def overview_markdown(df: pd.DataFrame) -> str:
    ov = build_overview(df)
    out = ["## Overview\n\nPer runtime: of a case's configurations (exporter, opset, options) on each torch, "
           "how many passed (✅ all · ◐ some · ❌ none · ⚠️ only known failures failed). Skipped cells are "
           "counted on one line per runtime and reason; the matrix below has the detail."]
    for g in ov.grids:
        table = [[md_text(case), *["" if c is None else f"{GLYPH[c.kind]} {c.text}" for c in cells]]
                 for case, cells in g.rows]
        out.append(f"### {md_text(g.runtime)}\n\n" + tabulate(
            table, headers=["case", *[f"torch {md_text(t)}" for t in g.torches]], tablefmt="github"))
    if ov.own_errors:
        out.append(f"**{ov.own_errors} cells have no verdict: the matrix's own code failed on them** "
                   "(see \"The matrix's own errors\" below; not counted above)")
    if ov.skips:
        out.append("**Skipped**\n\n" + "\n".join(f"- {md_text(s.runtime)}: {s.cells} cells skipped: "
                                                 f"{md_text(s.reason, 200)}" for s in ov.skips))
    return "\n\n".join(out) + "\n\n"
