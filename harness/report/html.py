"""Self-contained HTML reports (Jinja2, autoescaped): matrix.html per run, an index across runs, a site.

Pages work offline: CSS, JS and plots are inlined, nothing is fetched. Every text that comes from a
record reaches the page either through autoescaping or as JSON made safe inside <script>, and the
page script only ever assigns it with textContent.
"""
from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from harness.core.record import Record, count_by_status
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.core.text import ENCODE_ERRORS, bounded_name
from harness.report import diagnosis, plots
from harness.report.advise import advice_rows
from harness.report.aggregate import (
    AXES,
    FAILED,
    OWN_ERRORS,
    blame_groups,
    history,
    latency_legend,
    latency_text,
    load_note,
    previous_run,
    records_frame,
    root_cause_text,
    sorted_torch,
    status_changes,
    summaries,
    torch_bumps,
)
from harness.report.architectures import architectures_html
from harness.report.floors import floor_rows
from harness.report.markdown import OWN_ERROR_TEXT, render_markdown
from harness.report.overview import overview_context
from harness.report.passes import html_rows as passes_rows
from harness.report.pipelines import pipeline_names, pipeline_of, step_rows
from harness.store.runs import (
    cell_log_path,
    list_runs,
    load_run,
    read_index,
    write_report_file,
)

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LOG_EXCERPT_CHARS = 6000
# Words, not emoji: colour carries the status and headless/CI browsers often lack an emoji font.
S = Status
LEGEND = {S.PASS.value: "passed every stage", S.FAIL.value: "failed: first failing stage shown",
          S.CRASH.value: "worker died", S.TIMEOUT.value: "ran past cell_timeout_s",
          S.XFAIL.value: "known failure",
          S.XPASS.value: "known failure now passing", S.SKIP.value: "not run (reason in details)"}
# Shown only in runs that have such cells (runs without one render as before).
ERROR_LEGEND = {S.ERROR.value: "the matrix's own code failed: no verdict on the model"}
ERROR_CSS = "\n.s-error { background: var(--crash); color: var(--fg); outline: 1px dashed var(--crash-fg); }\n"
# The matrix's own error sorts last: it is no verdict (and the older statuses keep their ranks).
SEVERITY = {s.value: i for i, s in enumerate((S.CRASH, S.TIMEOUT, S.FAIL, S.XPASS, S.XFAIL, S.SKIP, S.PASS,
                                              S.ERROR))}

_env = Environment(loader=PackageLoader("harness.report", "templates"),
                   autoescape=select_autoescape(["html", "j2"], default=True),
                   trim_blocks=True, lstrip_blocks=True)
# Control characters (NUL, escape, C1) never reach a page raw: shown as \xNN text.
_PAGE_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def safe_href(url: Any) -> str | None:
    """A link a page may hold: http(s), or relative to the page (a path, a fragment); None for
    anything else (``javascript:``, ``data:``, ``file:``, a scheme hidden by whitespace or
    control characters, a host-relative ``//host``)."""
    if not isinstance(url, str) or not url.strip():
        return None
    bare = re.sub(r"[\x00-\x20\x7f]", "", url)       # what a browser ignores while it reads a scheme
    if bare.startswith(("//", "\\\\", "/\\", "\\/")):
        return None
    if _SCHEME.match(bare) or ":" in bare.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]:
        return url.strip() if re.match(r"^https?://", bare, re.IGNORECASE) else None
    return url.strip()


_env.filters["href"] = safe_href


def render_page(template: str, **context: Any) -> str:
    """A template rendered as a page: autoescaped, links through ``safe_href`` (the ``href``
    filter), and no raw control character anywhere in it."""
    html = _env.get_template(template).render(**context)
    return _PAGE_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", html)


def script_json(data: Any) -> Markup:
    """JSON that cannot end or comment out the <script> element it sits in (</, <!--, U+2028/9)."""
    text = json.dumps(data, ensure_ascii=False, default=str, allow_nan=False)
    for raw, safe in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                      ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, safe)
    return Markup(text)


def _clean(value: Any) -> Any:
    """NaN/inf are not JSON; give the page nulls instead."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def log_excerpt(run_dir: Path, rec: Record) -> str | None:
    """The cell's section of its log from the first traceback on, tail-trimmed to a readable size."""
    path = cell_log_path(run_dir, rec)
    if path is None:
        return None
    text = ANSI.sub("", path.read_text(encoding="utf-8", errors="replace"))
    marker = f"=== cell {rec.cell_id} ==="
    if rec.cell_id and marker in text:
        text = text.split(marker, 1)[1].split("\n=== cell ", 1)[0]
    start = text.find("Traceback (most recent call last)")
    text = (text[start:] if start >= 0 else text).strip()
    return text if len(text) <= LOG_EXCERPT_CHARS else "…" + text[-LOG_EXCERPT_CHARS:]


def latency_histogram(samples: list[float], bins: int = 24) -> dict[str, Any] | None:
    """Counts from the 1st percentile to Tukey's far-out fence: the shape, not the stragglers."""
    values = np.asarray([s for s in samples if isinstance(s, (int, float))], dtype=float)
    if values.size < 5:
        return None
    p1, q1, q3, p99 = np.percentile(values, [1, 25, 75, 99])
    lo, hi = float(p1), float(min(p99, q3 + 3 * (q3 - q1)))
    hi = hi if hi > lo else lo + 1e-9
    counts, _ = np.histogram(np.clip(values, lo, hi), bins=bins, range=(lo, hi))
    return {"counts": counts.tolist(), "lo": lo, "hi": hi, "n": int(values.size),
            "beyond": int((values > hi).sum())}


def cell_details(run_dir: Path, rec: Record, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    latency = rec.latency_ms.to_dict(samples=False)
    return _clean({**(extra or {}),
        "cell_id": rec.cell_id, "case": rec.case, "torch": rec.torch, "exporter": rec.exporter,
        "opset": rec.opset, "opset_actual": rec.opset_actual, "runtime": rec.runtime,
        "options": rec.options, "status": rec.status.value, "stage": rec.stage, "error": rec.error,
        "hint": rec.hint, "reason": rec.reason, "signature": rec.signature, "notes": rec.notes,
        "parity": rec.parity.to_dict(), "latency": latency,
        "histogram": latency_histogram(rec.latency_ms.samples),
        "versions": rec.versions, "duration_s": rec.duration_s, "graph": rec.graph,
        "repro": rec.repro, "bundle": rec.bundle, "log": log_excerpt(run_dir, rec),
        **({"blame": rec.blame.to_dict()} if rec.blame else {}),
    })


def html_cell_text(row: pd.Series) -> str:
    releases = f" · {row['releases']}" if row.get("releases") else ""   # report.floors
    if row["status"] == Status.PASS and pd.notna(row["latency"]):
        return latency_text(row["latency"], row.get("binding_overhead"), row.get("loaded"), row.get("bimodal")) + releases
    stage = row["stage"] if isinstance(row["stage"], str) and row["status"] != Status.PASS else ""
    return row["status"] + (f" · {stage}" if stage else "") + releases


def _declared_opset(row: pd.Series) -> int | None:
    actual = row["opset_actual"]
    return int(actual) if pd.notna(actual) and int(actual) != int(row["opset"]) else None


def matrix_rows(df: pd.DataFrame, torches: list[str]) -> list[dict[str, Any]]:
    """One row per (case, exporter, opset, options, runtime); one cell per torch version."""
    rows = []
    for key, grp in df.groupby(["case", "exporter", "opset", "options", "runtime"], sort=True):
        by_torch = {r["torch"]: r for _, r in grp.iterrows()}
        cells = []
        for t in torches:
            r = by_torch.get(t)
            cells.append(None if r is None else {
                "idx": int(r["idx"]), "status": r["status"], "text": html_cell_text(r),
                "op_actual": _declared_opset(r), "severity": SEVERITY.get(r["status"], 9),
                "party": _or_none(r["party"])})
        rows.append({"case": key[0], "exporter": key[1], "opset": int(key[2]), "options": key[3],
                     "pipeline": pipeline_of(key[3]),
                     "runtime": key[4], "cells": cells,
                     "skip_only": all(c is None or c["status"] == Status.SKIP for c in cells)})
    return rows


def failure_groups(df: pd.DataFrame) -> list[dict[str, Any]]:
    bad = df[df["status"].isin(FAILED)]
    groups = []
    for sig, grp in bad.groupby("signature", sort=False, dropna=False):
        first = grp.iloc[0]
        parties = sorted({p for p in grp["party"] if isinstance(p, str)})
        groups.append({"signature": _or_none(sig), "stage": _or_none(first["stage"]),
                       "error": _or_none(root_cause_text(first["error"])), "hint": _or_none(first["hint"]),
                       "party": ", ".join(parties) or None, "cells": len(grp),
                       "torch": ", ".join(sorted_torch(grp["torch"])),
                       "idx": [int(i) for i in grp["idx"]]})
    return sorted(groups, key=lambda g: -g["cells"])


def _plot_uri(svg: str | None) -> str | None:
    # A data: image cannot run script, so a plot is inert whatever text it carries.
    return None if svg is None else "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _table(frame: pd.DataFrame) -> dict[str, Any]:
    frame = frame.reset_index()
    return {"columns": [str(c) for c in frame.columns],
            "rows": [[None if pd.isna(v) else v for v in row] for row in frame.itertuples(index=False)]}


def _or_none(value: Any) -> Any:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _asset(name: str) -> Markup:
    text = (Path(__file__).parent / "templates" / name).read_text(encoding="utf-8")
    assert "</script" not in text.lower() and "</style" not in text.lower(), name
    return Markup(text)


def render_run_html(run_dir: Path, records: list[Record], meta: RunMeta,
                    previous: tuple[RunMeta, pd.DataFrame] | None = None,
                    plot_svgs: dict[str, str | None] | None = None, index_href: str | None = None,
                    index_label: str = "all runs") -> str:
    df = records_frame(records).reset_index(names="idx")
    torches = sorted_torch(df["torch"])
    changes = status_changes(previous[1], df) if previous is not None else None
    extras = diagnosis.cell_extras(run_dir, records)
    blamed = any(r.blame for r in records)
    own = df[df["status"].isin(OWN_ERRORS)]
    css = _asset("report.css") + (Markup(ERROR_CSS) if not own.empty else Markup(""))
    return render_page(
        "run.html.j2", meta=meta, run_id=meta.run_id, counts={k: v for k, v in count_by_status(records).items() if v},
        legend={**LEGEND, **(ERROR_LEGEND if not own.empty else {})}, latency_legend=latency_legend(df), torches=torches,
        rows=matrix_rows(df, torches), axes=AXES,
        overview=overview_context(df),
        axis_values={a: sorted(map(str, df[a].unique())) if a != "torch" else torches for a in AXES},
        statuses=sorted(df["status"].unique(), key=lambda s: SEVERITY.get(s, 9)),
        failures=failure_groups(df), own_errors=_records(own[["idx", "cell_id", "stage", "error"]]),
        own_error_text=OWN_ERROR_TEXT, blamed=blame_groups(df), blame_js=_asset("blame.js") if blamed else None,
        parties=sorted({p for p in df["party"] if isinstance(p, str)}), architectures=architectures_html(df),
        summaries={a: _table(t) for a, t in summaries(df).items()},
        previous_id=previous[0].run_id if previous else None,
        changes=None if changes is None else _records(changes),
        bumps=_records(torch_bumps(df)) if len(torches) > 1 else None,
        plots={k: _plot_uri(v) for k, v in (plot_svgs or {}).items()},
        details=script_json([cell_details(run_dir, r, extras.get(i)) for i, r in enumerate(records)]),
        drift=diagnosis.drift_rows(records), specialised=diagnosis.specialised_rows(records),
        reduced=diagnosis.reduced_rows(records), releases=floor_rows(records),
        details_js=_asset("details.js") if diagnosis.wants_details_script(records, extras) else None,
        started=_when(meta.started), index_href=index_href, index_label=index_label,
        load_note=load_note(records, meta), advice=advice_rows(records), passes_not_made=passes_rows(records),
        pipeline_steps=step_rows(records), pipelines=pipeline_names(records),
        pipelines_js=_asset("pipelines.js") if pipeline_names(records) else None, css=css, js=_asset("matrix.js"))


def render_index_html(reports: Path, run_href: Any) -> str:
    """Every run of the store, newest first, with the pass-rate history per torch version."""
    entries = list(reversed(read_index(reports)))
    hist = history(reports)
    rates = {(r.run_id, r.torch): r.pass_rate for r in hist.itertuples()}
    return render_page(
        "index.html.j2", entries=entries, run_href=run_href, rates=rates, when=_when,
        torches=sorted_torch(hist["torch"]) if not hist.empty else [],
        plot=_plot_uri(plots.history_plot(hist)), css=_asset("report.css"))


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts)) if isinstance(ts, (int, float)) else "?"


PLOTS = {"latency": plots.latency_plot, "parity": plots.parity_plot}
KEY_SUFFIX = ".key"   # beside plots/NAME.svg: the plot_key it was drawn from


def run_plots(records: list[Record], earlier: list[Path] = ()) -> tuple[dict[str, str | None], str | None]:
    """The run's plots (name → SVG, or None where there is nothing to plot) and their key; a
    plot that one of the ``earlier`` run directories drew from the same key is taken from it."""
    df = records_frame(records)
    if df.empty:
        return {}, None
    key = plots.plot_key(df)
    out: dict[str, str | None] = {}
    for name, draw in PLOTS.items():
        out[name] = next((svg for run in earlier if (svg := _drawn(run, name, key)) is not None), None) \
            or draw(df)
    return out, key


def _drawn(run_dir: Path, name: str, key: str) -> str | None:
    """The SVG ``run_dir`` drew for plot ``name`` from ``key``, if it did."""
    try:
        if (run_dir / "plots" / f"{name}{KEY_SUFFIX}").read_text(encoding="utf-8").strip() == key:
            return (run_dir / "plots" / f"{name}.svg").read_text(encoding="utf-8")
    except OSError:
        pass
    return None


def stored_plots(run_dir: Path) -> dict[str, str]:
    """Plots a previous render left in the run (they change only when its results do)."""
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted((Path(run_dir) / "plots").glob("*.svg"))}


def write_reports(run_dir: Path, records: list[Record], meta: RunMeta, reports: Path | None) -> Path:
    """All report files of one run (matrix.md, matrix.html, plots/); results and run.json stay as they are."""
    run_dir = Path(run_dir)
    runs = list_runs(reports) if reports is not None else []
    svgs, key = run_plots(records, [p for p in reversed(runs) if p.resolve() != run_dir.resolve()])
    written = []
    for name, svg in svgs.items():
        if svg:
            written.append(write_report_file(run_dir, f"plots/{name}.svg", svg).relative_to(run_dir).as_posix())
            write_report_file(run_dir, f"plots/{name}{KEY_SUFFIX}", f"{key}\n")
    previous = previous_run(meta, records_frame(records), reports) if records else None
    md = write_report_file(run_dir, "matrix.md", render_markdown(records, meta, previous, written))
    in_store = any(p.resolve() == run_dir.resolve() for p in runs)
    html = render_run_html(run_dir, records, meta, previous, svgs, "../../index.html" if in_store else None)
    write_report_file(run_dir, "matrix.html", html)
    if in_store:
        write_store_index(reports)
    return md


def write_store_index(reports: Path) -> Path:
    path = reports / "index.html"
    path.write_text(render_index_html(reports, lambda e: f"{e['dir']}/matrix.html"), encoding="utf-8", errors=ENCODE_ERRORS)
    return path


def write_site(reports: Path, site: Path) -> Path:
    """A static folder for GitHub Pages: index.html, runs/<run-id>.html, .nojekyll."""
    (site / "runs").mkdir(parents=True, exist_ok=True)
    (site / ".nojekyll").write_text("")
    for entry in read_index(reports):
        run_dir = reports / entry["dir"]
        if not (run_dir / "run.json").exists():
            continue
        meta, records = load_run(run_dir)
        previous = previous_run(meta, records_frame(records), reports) if records else None
        html = render_run_html(run_dir, records, meta, previous, stored_plots(run_dir) or run_plots(records)[0],
                               "../index.html")
        # A file name made from the id (never a path: an index entry is data).
        (site / "runs" / f"{bounded_name(entry['run_id'])}.html").write_text(html, encoding="utf-8",
                                                                           errors=ENCODE_ERRORS)
    index = site / "index.html"
    index.write_text(render_index_html(reports, lambda e: f"runs/{bounded_name(e['run_id'])}.html"),
                     encoding="utf-8", errors=ENCODE_ERRORS)
    return index
