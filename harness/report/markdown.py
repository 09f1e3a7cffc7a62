"""The markdown matrix (tabulate): one glyph per cell, a legend, failures by signature, changes."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from tabulate import tabulate

from harness.core.record import Record, count_by_status
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.report.advise import advice_markdown
from harness.report.aggregate import (
    FAILED,
    OWN_ERRORS,
    blame_groups,
    latency_legend,
    latency_text,
    load_note,
    records_frame,
    root_cause_text,
    status_changes,
    torch_bumps,
    torch_sort_key,
)
from harness.report.architectures import architectures_markdown
from harness.report.diagnosis import markdown_sections
from harness.report.floors import markdown_section as floors_section
from harness.report.overview import ROW, overview_markdown, skip_only_rows
from harness.report.passes import markdown_section as passes_section
from harness.report.pipelines import markdown_section as pipelines_section
from harness.report.text import md_code, md_text

S = Status
GLYPHS = {S.PASS.value: "✅", S.FAIL.value: "❌", S.CRASH.value: "💥", S.TIMEOUT.value: "⏱️",
          S.XFAIL.value: "⚠️", S.XPASS.value: "❗", S.SKIP.value: "⏭️", S.ERROR.value: "🛠️"}
LEGEND = ("✅ pass · ❌ fail (first failing stage) · 💥 crash · ⏱️ timeout · ⚠️ known failure (xfail) · "
          "❗ known failure now passing (xpass) · ⏭️ skip · `op18`: opset the file declares when it "
          "differs from the one requested · ms: median latency · †: measured on a loaded machine")
# Only in runs that have such cells, so that runs without one render as before.
ERROR_LEGEND = " · 🛠️ error: the matrix's own code failed (no verdict on the model)"


def cell_text(row: pd.Series) -> str:
    text = md_text(GLYPHS.get(row["status"], row["status"]))
    if row["status"] in FAILED + OWN_ERRORS and row["stage"]:
        text += f" {md_text(row['stage'])}"
    if row["status"] == Status.PASS and pd.notna(row["latency"]):
        text += " " + latency_text(row["latency"], row.get("binding_overhead"), row.get("loaded"), row.get("bimodal"))
    actual = row["opset_actual"]
    if pd.notna(actual) and int(actual) != int(row["opset"]):
        text += f" `op{int(actual)}`"
    if row.get("releases"):
        text += f" {md_text(row['releases'])}"
    return text


def matrix_tables(df: pd.DataFrame) -> str:
    out = []
    torches = sorted(df["torch"].unique(), key=torch_sort_key)
    only = skip_only_rows(df)
    df = df[[not only.get(tuple(k), False) for k in df[ROW].itertuples(index=False)]]
    for runtime, sub in df.groupby("runtime", sort=True):
        sub = sub.assign(text=sub.apply(cell_text, axis=1),
                         row_label=sub["opset"].map(lambda o: f"{o}") +
                         sub["options"].map(lambda s: f" ({s})" if s else ""))
        pivot = sub.pivot_table(index=["case", "exporter", "row_label"], columns="torch",
                                values="text", aggfunc="first")
        pivot = pivot.reindex(columns=[t for t in torches if t in pivot.columns]).fillna("")
        table = [[md_text(c), md_text(e), md_text(o), *vals]
                 for (c, e, o), vals in zip(pivot.index, pivot.values.tolist())]
        headers = ["case", "exporter", "opset", *[f"torch {md_text(t)}" for t in pivot.columns]]
        out.append(f"### {md_text(runtime)}\n\n" + tabulate(table, headers=headers, tablefmt="github"))
    return "\n\n".join(out)


def failures_table(df: pd.DataFrame) -> str:
    bad = df[df["status"].isin(FAILED)]
    if bad.empty:
        return "No failures."
    blamed = bool(bad["party"].notna().any())
    rows = []
    for sig, grp in bad.groupby("signature", sort=False, dropna=False):
        first = grp.iloc[0]
        where = ", ".join(sorted({f"{r.case}/{r.exporter}/op{r.opset}" for r in grp.itertuples()}))
        torches = ", ".join(sorted(grp["torch"].unique(), key=torch_sort_key))
        row = [md_code(sig), _short(first["stage"], 10), _short(root_cause_text(first["error"]), 110),
               _short(first["hint"], 160), len(grp), md_text(torches), _short(where, 120)]
        if blamed:
            parties = sorted({f"{p} ({r})" if isinstance(r, str) else p for p, r in zip(grp["party"], grp["repository"])
                              if isinstance(p, str)})
            row.insert(4, md_text(", ".join(parties)))
        rows.append(row)
    rows.sort(key=lambda r: -r[5 if blamed else 4])
    headers = ["signature", "stage", "error", "hint", "cells", "torch", "where"]
    if blamed:
        headers.insert(4, "blame")
    return tabulate(rows, headers=headers, tablefmt="github")


OWN_ERROR_TEXT = ("The matrix's own code failed on these cells (preparing inputs, measuring a fact): "
                  "they say nothing about the model, are counted apart from failures and attempts, and "
                  "are never reused from the store. This is the matrix's fault: report it to the "
                  "project with the cell's log (it holds the traceback).")


def own_errors_section(df: pd.DataFrame) -> str:
    """The cells the matrix's own code failed on (only in runs that have some)."""
    bad = df[df["status"].isin(OWN_ERRORS)]
    if bad.empty:
        return ""
    rows = [[md_code(r.cell_id), _short(r.stage, 10), _short(r.error, 160)] for r in bad.itertuples()]
    table = tabulate(rows, headers=["cell", "stage", "error"], tablefmt="github")
    return f"## The matrix's own errors\n\n{OWN_ERROR_TEXT}\n\n{table}\n\n"


def blame_section(df: pd.DataFrame) -> str:
    """Failures grouped by the party blamed (only for runs whose records carry a blame)."""
    groups = blame_groups(df)
    if not groups:
        return ""
    rows = [[md_text(g["party"]), md_text(g["repository"] or "the model's own code" if g["party"] == "model-code"
                                         else g["repository"] or "–"),
             g["cells"], _short(g["reason"], 160), _short(", ".join(g["cell_ids"]), 200)] for g in groups]
    headers = ["party", "report to", "cells", "why (first cell)", "cell ids"]
    if any(g.get("layer") for g in groups):   # runs blamed by layer (harness.worker.diagnose.layers)
        rows = [row + [md_text(g.get("layer") or "–")] for row, g in zip(rows, groups)]
        headers.append("layer")
    table = tabulate(rows, headers=headers, tablefmt="github")
    return ("## Failures by blamed party\n\nWho a failing cell is reported to, from the blame ladder (the ONNX "
            "reference evaluator, ONNX Runtime with optimisations off and on, the cell's runtime; see each "
            f"cell's `blame`). Each bundle holds `repro.py` and `ISSUE.md`.\n\n{table}\n\n")


def _short(text: Any, n: int) -> str:
    return md_text(text, n)


def changes_table(changes: pd.DataFrame) -> str:
    """Changed cells grouped under one heading per torch version (or torch bump)."""
    out = []
    for torch, grp in changes.groupby("torch", sort=False):
        rows = [[md_text(r.case), md_text(r.exporter), r.opset, md_text(r.runtime), md_text(r.options),
                 _status(r.before, None), _status(r.after, r.stage), _short(r.error, 90)]
                for r in grp.itertuples()]
        out.append(f"#### torch {md_text(torch)}\n\n" + tabulate(
            rows, headers=["case", "exporter", "opset", "runtime", "options", "before", "now", "error"],
            tablefmt="github"))
    return "\n\n".join(out)


def _status(status: str, stage: Any) -> str:
    text = f"{GLYPHS.get(status, '')} {md_text(status)}"
    return text + (f" ({md_text(stage)})" if isinstance(stage, str) and stage else "")


def changes_section(df: pd.DataFrame, previous: tuple[RunMeta, pd.DataFrame] | None) -> str:
    head = "## Changes since the previous run\n\n"
    if previous is None:
        return head + "No earlier run in the store shares cells with this one.\n"
    prev_meta, prev = previous
    changes = status_changes(prev, df)
    head += f"Compared with run {md_code(prev_meta.run_id)} on the cells both ran.\n\n"
    if changes.empty:
        return head + "No cell changed status.\n"
    return head + changes_table(changes) + "\n"


def bumps_section(df: pd.DataFrame) -> str:
    if df["torch"].nunique() < 2:
        return ""
    bumps = torch_bumps(df)
    body = changes_table(bumps) if not bumps.empty else "No cell changes status between torch versions."
    return f"## Changes between torch versions in this run\n\n{body}\n\n"


# Packages named in the existing-environments table (every one is in run.json's `installed`).
NAMED_PACKAGES = ("onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "numpy",
                  "transformers")


def existing_section(meta: RunMeta | None) -> str:
    """The environments the run used as they are (an interpreter, a local image): where each
    is and what it holds; "" when the run built all of its own."""
    rows = []
    for name, env in (meta.environments if meta else {}).items():
        found = env.get("existing")
        if not isinstance(found, dict):
            continue
        versions = dict(p.split("==", 1) for p in env.get("installed", []) if "==" in p)
        named = ", ".join(f"{n} {versions[n]}" for n in NAMED_PACKAGES if n in versions)
        where = f"image {found.get('image')} ({found.get('python')})" if found.get("image") else found.get("python")
        cuda = f", CUDA {found['cuda']}" if found.get("cuda") else ""
        rows.append(f"| {md_code(name)} | {md_code(str(where))} | torch {md_text(str(found.get('torch')))}{cuda}, "
                    f"Python {md_text(str(found.get('python_version')))} | {md_text(named)} "
                    f"({len(versions)} packages in run.json) |")
    if not rows:
        return ""
    return ("## Existing environments\n\nUsed as they are: nothing was installed there.\n\n"
            "| environment | where | torch | packages |\n|---|---|---|---|\n" + "\n".join(rows) + "\n\n")


def render_markdown(records: list[Record], meta: RunMeta | None = None,
                    previous: tuple[dict[str, Any], pd.DataFrame] | None = None,
                    plots: Iterable[str] = ()) -> str:
    counts = {k: v for k, v in count_by_status(records).items() if v}
    summary = " · ".join(f"{GLYPHS.get(k, '')} {k} {v}" for k, v in counts.items())
    head = (f"# Compatibility matrix: run {md_code(meta.run_id if meta else '?')}\n\n"
            f"**{len(records)} cells**: {summary}\n\n")
    if not records:
        return head + "No cells were run.\n"
    df = records_frame(records)
    links = " · ".join(f"[{md_text(Path(p).stem)}]({p})" for p in plots)
    loaded = load_note(records, meta)
    head += f"**{md_text(loaded)}**\n\n" if loaded else ""
    head += passes_section(records)   # passes that could not be made: read before the matrix
    head += existing_section(meta)
    folded = "Rows skipped on every torch are left out (see the overview's skip lines).\n\n" \
        if skip_only_rows(df).any() else ""
    legend = LEGEND + (ERROR_LEGEND if df["status"].isin(OWN_ERRORS).any() else "")
    return (head + f"{overview_markdown(df)}Legend: {legend}{latency_legend(df)}\n\n## Matrix\n\n{folded}{matrix_tables(df)}\n\n"
            f"{architectures_markdown(df)}{pipelines_section(records)}{advice_markdown(records)}{own_errors_section(df)}"
            f"## Failures by signature\n\n{failures_table(df)}\n\n{blame_section(df)}"
            f"{bumps_section(df)}{markdown_sections(records)}{floors_section(records)}{changes_section(df, previous)}"
            + (f"\nPlots: {links}\n" if links else ""))
