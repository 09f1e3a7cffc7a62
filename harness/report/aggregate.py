"""Aggregation with pandas: records as a frame, pivots, per-axis summaries, run-to-run changes, history."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from packaging.version import InvalidVersion, Version

from harness.core.cell import AXES as MATRIX_AXES
from harness.core.cell import CELL_COLUMNS
from harness.core.record import Record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.report.floors import floor_badge

# The axes the report summarises and filters on: every matrix axis that is a cell column.
AXES = tuple(a for a in MATRIX_AXES if a in CELL_COLUMNS)
# A cell's identity across runs as frame columns: torch plus the cell key ("options" is its label).
CELL_KEY = list(CELL_COLUMNS)
PASSED = [s.value for s in Status if s.passed]
# Shown as failures in tables (with their stage and signature): failed, crashed, hung, or known.
FAILED = [s.value for s in Status if s.is_failure] + [Status.XFAIL.value]
# The matrix's own failures: no verdict on the model, counted apart from failures and attempts.
OWN_ERRORS = [s.value for s in Status if s.is_own_error]
# Latencies this small are mostly the runtime binding's own per-call cost: shown with that
# binding overhead (the report's words, kept from schema v1: "(floor …)").
OVERHEAD_SHOWN_BELOW_MS = 0.1


def records_frame(records: Iterable[Record]) -> pd.DataFrame:
    rows = []
    for r in records:
        rows.append({
            "case": r.case, "torch": r.torch, "exporter": r.exporter, "opset": r.opset,
            "runtime": r.runtime, "options": r.key.options.label, "status": r.status.value,
            "stage": r.stage, "error": r.error, "signature": r.signature, "hint": r.hint,
            "opset_actual": r.opset_actual, "latency": r.latency_ms.median,
            "binding_overhead": r.latency_ms.binding_overhead_ms, "loaded": bool(r.latency_ms.loaded),
            "bimodal": bool(r.latency_ms.bimodal),
            "max_abs": r.parity.max_abs, "reason": r.reason, "cell_id": r.cell_id,
            "bundle": r.bundle, "repro": r.repro,
            "party": r.blame.party if r.blame else None,
            "repository": r.blame.repository if r.blame else None,
            "blame_reason": r.blame.reason if r.blame else None,
            "layer": (f"{r.blame.layer} ({r.blame.kind})" if r.blame.kind else r.blame.layer)
            if r.blame and r.blame.layer else None,
            "releases": floor_badge(r),   # runtime floor / failing deployed release (report.floors)
        })
    columns = ["case", "torch", "exporter", "opset", "runtime", "options", "status", "stage", "error",
               "signature", "hint", "opset_actual", "latency", "binding_overhead", "loaded", "bimodal", "max_abs", "reason",
               "cell_id",
               "bundle", "repro", "party", "repository", "blame_reason", "layer", "releases"]
    return pd.DataFrame(rows, columns=columns)


def root_cause_text(error: Any) -> Any:
    """What a reader should see of an error: its root cause (after the last ``<-``) first, the
    wrapper's type after it, so a generic wrapper ("TorchExportError: Failed to export the model
    with torch.export. This is step 1/3…") never hides the cause."""
    if not isinstance(error, str) or " <- " not in error:
        return error
    outer, root = error.split(" <- ", 1)[0], error.rsplit(" <- ", 1)[1]
    return f"{root} (in {outer.split(':', 1)[0].strip()})"


def blame_groups(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Failing cells grouped by the party blamed (records without blame are left out)."""
    bad = df[df["status"].isin(FAILED) & df["party"].notna()]
    out = []
    for (party, repo, layer), grp in bad.groupby(["party", bad["repository"].fillna(""), bad["layer"].fillna("")],
                                                 sort=False):
        out.append({"party": party, "repository": repo or None, "layer": layer or None, "cells": len(grp),
                    "reason": grp.iloc[0]["blame_reason"], "cell_ids": sorted(grp["cell_id"]),
                    "idx": [int(i) for i in grp["idx"]] if "idx" in grp else []})
    return sorted(out, key=lambda g: (-g["cells"], g["party"]))


LOADED_MARK = "†"
BIMODAL_MARK = "‡"


def latency_text(latency: float, overhead: Any, loaded: Any = False, bimodal: Any = False) -> str:
    """'0.012 ms', or '0.012 ms (floor 0.009)' below OVERHEAD_SHOWN_BELOW_MS where a binding
    overhead was recorded; marked † when it was measured on a loaded machine, ‡ when fresh processes timed it
    in two modes (the figure is the median of their medians; the details give both modes)."""
    text = f"{latency:.3g} ms"
    if overhead is not None and pd.notna(overhead) and latency < OVERHEAD_SHOWN_BELOW_MS:
        text += f" (floor {overhead:.2g})"
    if loaded is True:
        text += f" {LOADED_MARK}"
    if bimodal is True:
        text += f" {BIMODAL_MARK}"
    return text


def load_note(records: list[Record], meta: RunMeta | None = None) -> str:
    """The run header's line on load: how many latencies were taken on a loaded machine (and the
    load average when the run started); '' when none was."""
    timed = [r for r in records if r.latency_ms.median is not None]
    loaded = [r for r in timed if r.latency_ms.loaded]
    if not loaded:
        return ""
    others = sorted(r.latency_ms.load.get("other_cpu") for r in loaded
                    if isinstance(r.latency_ms.load.get("other_cpu"), (int, float)))
    busy = f" (other processes used a median {others[len(others) // 2]:.0%} of the CPUs while they were timed)" if others else ""
    start = ""
    host = meta.host if meta is not None else {}
    if isinstance(host.get("loadavg"), list) and host["loadavg"]:
        start = f"; load average {host['loadavg'][0]:g} on {host.get('cpus', '?')} CPUs when the run started"
    return (f"{LOADED_MARK} {len(loaded)} of {len(timed)} latencies were measured on a loaded machine{busy}{start}: "
            f"their figures may be several times too high, and the gate does not call them slower.")


def latency_legend(df: pd.DataFrame) -> str:
    """The legend's explanation of the binding overhead and of ‡, each only for runs that have one."""
    out = ""
    if "binding_overhead" in df and df["binding_overhead"].notna().any():
        out += (f" · (floor …): the runtime binding's own per-call median on an identity model, shown "
                f"below {OVERHEAD_SHOWN_BELOW_MS:g} ms")
    if "bimodal" in df and df["bimodal"].any():
        out += (f" · {BIMODAL_MARK}: fresh processes timed it in two modes (the median of their medians; "
                "both modes in the cell's details)")
    return out


def torch_sort_key(v: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


def sorted_torch(values: Iterable[str]) -> list[str]:
    return sorted(set(values), key=torch_sort_key)


def pivot(df: pd.DataFrame, index: list[str] | str, columns: str, values: str = "status",
          aggfunc: Any = "first") -> pd.DataFrame:
    """Any axis against any other: e.g. pivot(df, ["case", "exporter"], "torch")."""
    table = df.pivot_table(index=index, columns=columns, values=values, aggfunc=aggfunc)
    if columns == "torch":
        table = table.reindex(columns=sorted_torch(table.columns))
    return table


def summary(df: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Status counts per value of one axis, with a pass rate over the cells that were attempted."""
    counts = pd.crosstab(df[axis], df["status"])
    attempted = counts.drop(columns=[Status.SKIP.value, *OWN_ERRORS], errors="ignore").sum(axis=1)
    passed = counts[[s for s in PASSED if s in counts.columns]].sum(axis=1)
    counts["cells"] = counts.drop(columns=["cells"], errors="ignore").sum(axis=1)
    counts["pass_rate"] = (passed / attempted.where(attempted > 0)).round(3)
    if axis == "torch":
        counts = counts.reindex(sorted_torch(counts.index))
    counts.columns.name = None
    return counts


def summaries(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {axis: summary(df, axis) for axis in AXES if not df.empty}


def status_changes(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Cells present in both frames whose status differs (columns: CELL_KEY, before, after, ...)."""
    left = before[CELL_KEY + ["status"]].drop_duplicates(CELL_KEY)
    right = after[CELL_KEY + ["status", "stage", "error"]].drop_duplicates(CELL_KEY)
    both = left.merge(right, on=CELL_KEY, suffixes=("_before", "_after"))
    changed = both[both["status_before"] != both["status_after"]].rename(
        columns={"status_before": "before", "status_after": "after"})
    order = changed["torch"].map(torch_sort_key)
    return changed.assign(_t=order).sort_values(["_t", "case", "exporter", "opset", "runtime"]).drop(
        columns="_t").reset_index(drop=True)


def shares_cells(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    keys = a[CELL_KEY].drop_duplicates().merge(b[CELL_KEY].drop_duplicates(), on=CELL_KEY)
    return not keys.empty


def previous_run(meta: RunMeta, df: pd.DataFrame, reports: Path | None
                 ) -> tuple[RunMeta, pd.DataFrame] | None:
    """The newest run of the store that started before this one and shares at least one cell."""
    from harness.store.runs import load_run, read_index

    if reports is None or df.empty:
        return None
    torches = set(df["torch"])
    started = meta.started or float("inf")
    for entry in reversed(read_index(reports)):
        if entry["run_id"] == meta.run_id or (entry.get("started") or 0) >= started:
            continue
        if entry.get("torch") and not torches & set(entry["torch"]):
            continue  # cheap test from the index before reading its results
        run_dir = reports / entry["dir"]
        if not (run_dir / "run.json").exists():
            continue
        prev_meta, prev_records = load_run(run_dir)
        prev = records_frame(prev_records)
        if shares_cells(prev, df):
            return prev_meta, prev
    return None


def history(reports: Path) -> pd.DataFrame:
    """Pass rate per torch version for every run in the index, oldest run first."""
    from harness.store.runs import load_run, read_index, torch_counts

    rows = []
    for entry in read_index(reports):
        by_torch = entry.get("by_torch")
        if by_torch is None and (reports / entry["dir"] / "run.json").exists():
            # Indexed before per-torch counts were kept: count from the stored results once.
            by_torch = torch_counts(load_run(reports / entry["dir"])[1])
        for torch, c in (by_torch or {}).items():
            rows.append({"run_id": entry["run_id"], "started": entry.get("started"), "torch": torch,
                         "passed": c["passed"], "cells": c["cells"],
                         "pass_rate": c["passed"] / c["cells"] if c["cells"] else float("nan")})
    return pd.DataFrame(rows, columns=["run_id", "started", "torch", "passed", "cells", "pass_rate"])


def torch_bumps(df: pd.DataFrame) -> pd.DataFrame:
    """Within one run: cells whose status differs between consecutive torch versions (from → to)."""
    torches = sorted_torch(df["torch"]) if not df.empty else []
    parts = []
    for old, new in zip(torches, torches[1:]):
        before = df[df["torch"] == old].assign(torch=new)
        changed = status_changes(before, df[df["torch"] == new])
        parts.append(changed.assign(torch=f"{old} → {new}"))
    if not parts:
        return pd.DataFrame(columns=CELL_KEY + ["before", "after", "stage", "error"])
    return pd.concat(parts, ignore_index=True)
