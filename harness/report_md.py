"""The markdown matrix (tabulate): one glyph per cell, a legend, failures grouped by signature."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from packaging.version import InvalidVersion, Version
from tabulate import tabulate

from harness.records import Record, count_by_status, option_label

GLYPHS = {"pass": "✅", "fail": "❌", "crash": "💥", "timeout": "⏱️", "xfail": "⚠️", "xpass": "❗", "skip": "⏭️"}
LEGEND = ("✅ pass · ❌ fail (first failing stage) · 💥 crash · ⏱️ timeout · ⚠️ known failure (xfail) · "
          "❗ known failure now passing (xpass) · ⏭️ skip · `op18`: opset the file declares when it "
          "differs from the one requested · ms: median latency")


def records_frame(records: Iterable[Record]) -> pd.DataFrame:
    rows = []
    for r in records:
        rows.append({
            "case": r.case, "torch": r.torch, "exporter": r.exporter, "opset": r.opset,
            "runtime": r.runtime, "options": option_label(r.options), "status": r.status,
            "stage": r.stage, "error": r.error, "signature": r.signature, "hint": r.hint,
            "opset_actual": r.opset_actual, "latency": (r.latency_ms or {}).get("median"),
            "max_abs": (r.parity or {}).get("max_abs"), "reason": r.reason, "cell_id": r.cell_id,
            "bundle": r.bundle, "repro": r.repro,
        })
    return pd.DataFrame(rows)


def cell_text(row: pd.Series) -> str:
    text = GLYPHS.get(row["status"], row["status"])
    if row["status"] in ("fail", "crash", "timeout", "xfail") and row["stage"]:
        text += f" {row['stage']}"
    if row["status"] == "pass" and pd.notna(row["latency"]):
        text += f" {row['latency']:.2f} ms"
    actual = row["opset_actual"]
    if pd.notna(actual) and int(actual) != int(row["opset"]):
        text += f" `op{int(actual)}`"
    return text


def torch_sort_key(v: str):
    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


def matrix_tables(df: pd.DataFrame) -> str:
    out = []
    torches = sorted(df["torch"].unique(), key=torch_sort_key)
    for runtime, sub in df.groupby("runtime", sort=True):
        sub = sub.assign(text=sub.apply(cell_text, axis=1),
                         row_label=sub["opset"].map(lambda o: f"{o}") +
                         sub["options"].map(lambda s: f" ({s})" if s else ""))
        pivot = sub.pivot_table(index=["case", "exporter", "row_label"], columns="torch",
                                values="text", aggfunc="first")
        pivot = pivot.reindex(columns=[t for t in torches if t in pivot.columns]).fillna("")
        table = [[c, e, o, *vals] for (c, e, o), vals in zip(pivot.index, pivot.values.tolist())]
        headers = ["case", "exporter", "opset", *[f"torch {t}" for t in pivot.columns]]
        out.append(f"### {runtime}\n\n" + tabulate(table, headers=headers, tablefmt="github"))
    return "\n\n".join(out)


def failures_table(df: pd.DataFrame) -> str:
    bad = df[df["status"].isin(["fail", "crash", "timeout", "xfail"])]
    if bad.empty:
        return "No failures."
    rows = []
    for sig, grp in bad.groupby("signature", sort=False, dropna=False):
        first = grp.iloc[0]
        where = ", ".join(sorted({f"{r.case}/{r.exporter}/op{r.opset}" for r in grp.itertuples()}))
        torches = ", ".join(sorted(grp["torch"].unique(), key=torch_sort_key))
        rows.append([f"`{sig}`", _short(first["stage"], 10), _short(first["error"], 110),
                     _short(first["hint"], 160), len(grp), torches, _short(where, 120)])
    rows.sort(key=lambda r: -r[4])
    return tabulate(rows, headers=["signature", "stage", "error", "hint", "cells", "torch", "where"],
                    tablefmt="github")


def _short(text: Any, n: int) -> str:
    s = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    s = s.replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"


def render_markdown(records: list[Record], meta: dict[str, Any] | None = None) -> str:
    meta = meta or {}
    counts = {k: v for k, v in count_by_status(records).items() if v}
    summary = " · ".join(f"{GLYPHS.get(k, '')} {k} {v}" for k, v in counts.items())
    head = f"# Compatibility matrix: run `{meta.get('run_id', '?')}`\n\n**{len(records)} cells**: {summary}\n\n"
    if not records:
        return head + "No cells were run.\n"
    df = records_frame(records)
    return (head + f"Legend: {LEGEND}\n\n## Matrix\n\n{matrix_tables(df)}\n\n"
            f"## Failures by signature\n\n{failures_table(df)}\n")


def write_markdown(run_dir: Path, records: list[Record], meta: dict[str, Any]) -> Path:
    path = Path(run_dir) / "matrix.md"
    path.write_text(render_markdown(records, meta), encoding="utf-8")
    return path
