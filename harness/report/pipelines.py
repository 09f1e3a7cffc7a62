"""The report's pipelines section: each post-export step of each export, per torch release, with
its verdict, node counts before and after, what it fused and its time (``graph.pipeline``, written
by harness.worker.steps). Present only in runs with pipelines: other runs render as they did.

One row per (case, exporter, opset, options, step) and torch release; the fused counts of one
row across releases are the graph drift a bump that loses a fusion shows (docs/pipelines.md).
"""
from __future__ import annotations

from typing import Any, Iterable

from tabulate import tabulate

from harness.core.cell import RAW_PIPELINE
from harness.core.record import Record
from harness.report.text import md_text


def pipeline_of(options_label: str) -> str:
    """A matrix row's pipeline, from its options label ('noopt,pipe-int8' -> 'int8')."""
    return next((p[len("pipe-"):] for p in str(options_label or "").split(",") if p.startswith("pipe-")), RAW_PIPELINE)


def pipeline_names(records: Iterable[Record]) -> list[str]:
    """The run's pipelines, for the report's filter; empty for a run of raw cells only."""
    names = sorted({r.key.options.pipeline for r in records})
    return [] if names in ([], [RAW_PIPELINE]) else names


def _fused(entry: dict[str, Any]) -> str:
    fused = {k: v for k, v in (entry.get("fused") or {}).items() if v}
    return ", ".join(f"{k} {v}" for k, v in sorted(fused.items())) or ("none" if "fused" in entry else "")


def step_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """One row per export and step, per torch release (the cells of one export share its steps)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in records:
        pipeline = (r.graph or {}).get("pipeline") or {}
        for i, entry in enumerate(pipeline.get("steps") or []):
            key = (r.case, r.exporter, r.opset, r.key.options.label, i, r.torch)
            if key in seen:
                continue
            before, after = entry.get("before") or {}, entry.get("after") or {}
            seen[key] = {
                "case": r.case, "exporter": r.exporter, "opset": r.opset, "options": r.key.options.label,
                "pipeline": pipeline.get("name"), "torch": r.torch, "index": i + 1, "step": entry.get("step"),
                "status": entry.get("status") or "?", "error": entry.get("error"),
                "nodes": f"{before.get('nodes', '?')} → {after.get('nodes', '?')}" if after else "",
                "bytes": after.get("bytes"), "fused": _fused(entry), "seconds": entry.get("seconds"),
                "strict": entry.get("strict_shape_inference"),
            }
    return sorted(seen.values(), key=lambda x: (x["pipeline"] or "", x["case"], x["exporter"], x["opset"],
                                                 x["options"], x["index"], x["torch"]))


def _export(row: dict[str, Any]) -> str:
    return f"{row['exporter']} op{row['opset']}" + (f" ({row['options']})" if row["options"] else "")


def markdown_section(records: list[Record]) -> str:
    rows = step_rows(records)
    if not rows:
        return ""
    table = [[md_text(r["pipeline"]), md_text(r["case"]), md_text(_export(r)), r["torch"],
              f"{r['index']}. {md_text(r['step'])}", r["status"] + (f": {md_text(str(r['error'])[:120])}" if r["error"] else ""),
              r["nodes"], md_text(r["fused"]), "" if r["seconds"] is None else f"{r['seconds']:.2f}",
              "" if r["strict"] in (None, "ok") else "fails"]
             for r in rows]
    headers = ["pipeline", "case", "export", "torch", "step", "step verdict", "nodes", "fused", "s",
               "strict shape inference"]
    return ("## Pipelines\n\nEach post-export step of each export (docs/pipelines.md); the fused counts of a "
            "row across torch releases are its drift.\n\n" + tabulate(table, headers=headers, tablefmt="github")
            + "\n\n")
