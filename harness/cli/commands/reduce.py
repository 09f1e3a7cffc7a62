"""`reduce`: reduce failing cells' files to the smallest graph that still fails."""
from __future__ import annotations

import argparse

from harness.cli import _options as opts
from harness.cli._options import ConfigError

HELP = "reduce failing cells' files to the smallest graph that still fails"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", default="latest", help="run id or directory (default: latest)")
    p.add_argument("--cell", action="append", default=[], metavar="CELL_ID",
                   help="only this cell (repeatable; default: every failure at load, run or parity)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per cell (default 120)")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Reduce failing cells of a stored run to the smallest graph that still fails."""
    from harness.report import render_run
    from harness.run.post.reduction import reduce_run
    from harness.store.runs import resolve_run

    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be > 0 (got {args.timeout})")
    run_dir = resolve_run(args.run, args.reports)
    try:
        results = reduce_run(run_dir, args.cell or None, args.timeout)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not results:
        print(f"{run_dir.name}: no failing cell at load, run or parity with a bundle: nothing to reduce")
        return 0
    render_run(run_dir, args.reports)
    print(f"{len(results)} cell(s) reduced into their bundles; reports re-rendered: {run_dir / 'matrix.md'}")
    return 0
