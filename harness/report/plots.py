"""Plots (matplotlib, Agg): latency and parity across torch versions, pass rate across runs.

Each plot is returned as SVG text; reports embed it as a data: image, so nothing in it can run.
A run's plots are drawn from a few columns of its records (``PLOT_COLUMNS``): ``plot_key`` is a
digest of those, of this module and of matplotlib's release, and a render takes a plot with the
same key from an earlier run of the store instead of drawing it again (an unchanged re-run).
"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI machines; must precede pyplot

import matplotlib.pyplot as plt
import pandas as pd

from harness.report.aggregate import PASSED, sorted_torch

STYLE = {"svg.fonttype": "path", "svg.hashsalt": "torch-onnx-matrix", "font.size": 8,
         "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3}
MAX_PANELS = 12  # beyond this a grid of tiny panels says nothing; the HTML table has every value
# Everything a plot of this module reads from a run's records (``records_frame``).
PLOT_COLUMNS = ["case", "torch", "runtime", "exporter", "status", "latency", "max_abs"]


def plot_key(df: pd.DataFrame) -> str:
    """A digest of what the plots are drawn from: the rows' plotted columns (in any order: the
    drawing sorts them), this module's code and matplotlib's release. Equal keys, equal SVGs."""
    data = df[PLOT_COLUMNS].astype(str).sort_values(PLOT_COLUMNS).to_csv(index=False)
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(matplotlib.__version__.encode() + b"\0" + data.encode())
    return h.hexdigest()[:16]


def _svg(fig) -> str:
    buf = io.StringIO()
    # A fixed date keeps re-rendered SVGs byte-identical when nothing changed.
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def _panels(df: pd.DataFrame, value: str, ylabel: str, title: str, log: bool) -> str | None:
    data = df.dropna(subset=[value])
    data = data[data[value] > 0] if log else data
    if data.empty:
        return None
    cases = sorted(data["case"].unique())[:MAX_PANELS]
    torches = sorted_torch(data["torch"])
    cols = min(3, len(cases))
    rows = (len(cases) + cols - 1) // cols
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.4 * rows), squeeze=False)
        for ax, case in zip(axes.flat, cases):
            sub = data[data["case"] == case]
            # One line per (runtime, exporter); opsets and options collapse to their best value.
            for (runtime, exporter), grp in sub.groupby(["runtime", "exporter"]):
                best = grp.groupby("torch")[value].min().reindex(torches)
                ax.plot(range(len(torches)), best.values, marker="o", ms=3, label=f"{runtime} · {exporter}")
            ax.set_title(case)
            ax.set_xticks(range(len(torches)), torches)
            ax.set_xlim(-0.5, len(torches) - 0.5)
            if log:
                ax.set_yscale("log")
            ax.set_ylabel(ylabel)
        for ax in list(axes.flat)[len(cases):]:
            ax.set_visible(False)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=4, frameon=False,
                   bbox_to_anchor=(0.5, -0.02 - 0.04 / rows))
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        return _svg(fig)


def latency_plot(df: pd.DataFrame) -> str | None:
    """Median latency per case across torch versions, a line per runtime and exporter."""
    passed = df[df["status"].isin(PASSED)]
    return _panels(passed, "latency", "median ms", "Latency (median, best opset)", log=False)


def parity_plot(df: pd.DataFrame) -> str | None:
    """Largest absolute difference from torch eager per case across torch versions (log scale)."""
    return _panels(df, "max_abs", "max |onnx − eager|", "Parity error (max_abs, best opset)", log=True)


def history_plot(hist: pd.DataFrame) -> str | None:
    """Pass rate per torch version, one point per run that ran it, oldest run first."""
    if hist.empty:
        return None
    runs = list(dict.fromkeys(hist.sort_values("started")["run_id"]))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7, 2.6))
        for torch in sorted_torch(hist["torch"]):
            sub = hist[hist["torch"] == torch].set_index("run_id").reindex(runs)
            ax.plot(range(len(runs)), sub["pass_rate"] * 100, marker="o", ms=4, label=f"torch {torch}")
        ax.set_xticks(range(len(runs)), runs, rotation=30, ha="right")
        ax.set_ylim(-5, 105)
        ax.set_ylabel("cells passing (%)")
        ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
        ax.set_title("Pass rate per torch version across runs", fontsize=10)
        fig.tight_layout()
        return _svg(fig)
