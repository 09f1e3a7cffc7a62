"""The architectures view of a zoo run: one row per architecture, one column per torch release ×
exporter, one table per runtime.

A cell shows the newest opset at which the architecture passes every stage on that runtime
(``✅ op23``), else the failure of its newest opset (``❌ export:20a63f23``: the stage and the
signature the failures table explains), else ``⏭️`` (skipped: the reason is in the cell details).
Above the tables, one line per torch release counts how many architectures each exporter
exports (the export stage succeeds for some opset) and how many pass on some runtime, out of the
architectures that were attempted (not skipped).

Shown only for runs with zoo cases (``hf-``, ``timm-``, ``torchvision-``); other runs render as
before.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.core.status import Stage, Status
from harness.probes.zoo import is_zoo_case
from harness.report.aggregate import FAILED, PASSED, sorted_torch

GLYPH = {Status.PASS.value: "✅", Status.XPASS.value: "❗", Status.FAIL.value: "❌",
         Status.CRASH.value: "💥", Status.TIMEOUT.value: "⏱️", Status.XFAIL.value: "⚠️",
         Status.SKIP.value: "⏭️", Status.ERROR.value: "🛠️"}


def zoo_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["case"].map(is_zoo_case)] if not df.empty else df


def cell_summary(group: pd.DataFrame) -> dict[str, Any]:
    """One architecture × torch × exporter × runtime: the newest passing opset, else the newest
    failure, else a skip."""
    passed = group[group["status"].isin(PASSED)]
    if not passed.empty:
        best = passed.sort_values("opset").iloc[-1]
        return {"status": best["status"], "opset": int(best["opset"]), "text": f"op{int(best['opset'])}",
                "idx": _idx(best)}
    failed = group[group["status"].isin(FAILED)]
    if not failed.empty:
        worst = failed.sort_values("opset").iloc[-1]
        sig = worst["signature"] if isinstance(worst["signature"], str) else (worst["stage"] or "")
        return {"status": worst["status"], "opset": int(worst["opset"]), "text": sig, "idx": _idx(worst)}
    first = group.iloc[0]
    return {"status": first["status"], "opset": None, "text": "", "idx": _idx(first)}


def _idx(row: pd.Series) -> int | None:
    return int(row["idx"]) if "idx" in row and pd.notna(row["idx"]) else None


def columns(df: pd.DataFrame) -> list[tuple[str, str]]:
    exporters = sorted(df["exporter"].unique())
    return [(t, e) for t in sorted_torch(df["torch"]) for e in exporters
            if not df[(df["torch"] == t) & (df["exporter"] == e)].empty]


def architecture_tables(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """runtime → {"columns": [(torch, exporter)], "rows": [(case, [cell summary | None])]}."""
    zoo = zoo_frame(df)
    out: dict[str, dict[str, Any]] = {}
    cols = columns(zoo)
    for runtime, sub in zoo.groupby("runtime", sort=True):
        cells = {key: cell_summary(g) for key, g in sub.groupby(["case", "torch", "exporter"], sort=False)}
        rows = [(case, [cells.get((case, t, e)) for t, e in cols]) for case in sorted(sub["case"].unique())]
        out[runtime] = {"columns": cols, "rows": rows}
    return out


def count_lines(df: pd.DataFrame) -> list[str]:
    """Per torch release, per exporter: architectures exported / passing, of those attempted."""
    zoo = zoo_frame(df)
    lines = []
    for torch in sorted_torch(zoo["torch"]):
        parts = []
        for exporter in sorted(zoo["exporter"].unique()):
            sub = zoo[(zoo["torch"] == torch) & (zoo["exporter"] == exporter)]
            if sub.empty:
                continue
            attempted = sub[~sub["status"].isin([Status.SKIP.value, Status.ERROR.value])]
            cases = attempted["case"].unique()
            exported = attempted[attempted["status"].isin(PASSED)
                                 | (attempted["stage"].notna() & (attempted["stage"] != Stage.EXPORT.value))]
            passing = attempted[attempted["status"].isin(PASSED)]
            skipped = sub["case"].nunique() - len(cases)
            parts.append(f"{exporter} exports {exported['case'].nunique()} of {len(cases)} architectures "
                         f"({passing['case'].nunique()} pass on some runtime"
                         + (f"; {skipped} skipped" if skipped else "") + ")")
        lines.append(f"torch {torch}: " + " · ".join(parts))
    return lines


def architectures_markdown(df: pd.DataFrame) -> str:
    """The markdown section; '' for a run without zoo cases (its matrix.md is unchanged)."""
    if zoo_frame(df).empty:
        return ""
    out = ["## Architectures\n",
           "Newest opset passing every stage (`op23`), else the newest failure's signature "
           "(see Failures by signature), ⏭️ skipped (reason in the HTML cell details).\n",
           "\n".join(f"- {line}" for line in count_lines(df)) + "\n"]
    for runtime, table in architecture_tables(df).items():
        headers = ["architecture", *[f"{e} {t}" for t, e in table["columns"]]]
        rows = [[case, *[_md(c) for c in cells]] for case, cells in table["rows"]]
        out.append(f"### {runtime}\n\n" + tabulate(rows, headers=headers, tablefmt="github") + "\n")
    return "\n".join(out) + "\n"


def _md(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return ""
    text = cell["text"]
    return GLYPH.get(cell["status"], cell["status"]) + (f" `{text}`" if text else "")


def architectures_html(df: pd.DataFrame) -> dict[str, Any] | None:
    """What the HTML template's architectures section needs; None without zoo cases."""
    if zoo_frame(df).empty:
        return None
    tables = architecture_tables(df)
    return {"counts": count_lines(df),
            "tables": [{"runtime": rt, "columns": [f"{e} {t}" for t, e in tb["columns"]],
                        "rows": [{"case": case, "cells": cells} for case, cells in tb["rows"]]}
                       for rt, tb in tables.items()]}
