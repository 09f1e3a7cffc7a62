"""`report`: re-render reports from stored results."""
from __future__ import annotations

import argparse

from harness.cli import _options as opts

HELP = "re-render reports from stored results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="*", help="run ids or directories (default: latest)")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Re-render report files from stored results; results.jsonl and run.json are only read."""
    from harness.report import render_run
    from harness.report.html import write_store_index
    from harness.store.runs import read_run_meta, resolve_run

    for ref in args.runs or ["latest"]:
        run_dir = resolve_run(ref, args.reports)
        path = render_run(run_dir, args.reports)
        print(f"{read_run_meta(run_dir).run_id}: {path} {path.with_name('matrix.html')}")
    if (args.reports / "index.json").exists():
        print(f"index: {write_store_index(args.reports)}")
    return 0
