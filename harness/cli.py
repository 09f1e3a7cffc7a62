"""Command line: python -m harness {matrix,plan,report} (nox sessions call these)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.config import ConfigError, load_matrix
from harness.plan import build_plan, parse_only
from harness.store import REPORTS

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "matrix.yaml"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="matrix file (default: matrix.yaml)")
    p.add_argument("--only", default=None, help="filter cells, e.g. torch=2.13.0,exporter=dynamo|torchscript")


def cmd_matrix(args: argparse.Namespace) -> int:
    from harness.execute import execute

    matrix = load_matrix(args.config)
    plan = build_plan(matrix, parse_only(args.only))
    if not plan.cells:
        print(f"{args.config}: the filter leaves no cells to run", file=sys.stderr)
        return 2
    run_dir = execute(matrix, args.config, plan, args.output, args.reports, args.provider, args.resume)
    print(f"run directory: {run_dir}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.config)
    plan = build_plan(matrix, parse_only(args.only))
    for env in plan.environments:
        print(f"{env.env.name}: {' '.join(env.env.packages)}")
        for cell in env.cells:
            print(f"  {cell.cell_id}")
    print(f"{len(plan.cells)} cells in {len(plan.environments)} environments")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report_md import write_markdown
    from harness.store import load_run, resolve_run

    for ref in args.runs or ["latest"]:
        run_dir = resolve_run(ref, args.reports)
        meta, records = load_run(run_dir)
        path = write_markdown(run_dir, records, meta)
        print(f"{meta['run_id']}: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    parser.add_argument("--reports", type=Path, default=REPORTS, help="results store (default: reports/)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("matrix", help="run a matrix")
    _common(p)
    p.add_argument("--output", type=Path, default=None, help="run directory (default: reports/runs/<run-id>)")
    p.add_argument("--provider", choices=["venv", "docker"], default="venv")
    p.add_argument("--resume", action="store_true", help="continue the newest unfinished run")
    p.set_defaults(func=cmd_matrix)
    p = sub.add_parser("plan", help="print environments and cells without running them")
    _common(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("report", help="re-render reports from stored results")
    p.add_argument("runs", nargs="*", help="run ids or directories (default: latest)")
    p.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
