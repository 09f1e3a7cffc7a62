"""Command line: python -m harness {matrix,plan,report,publish,gate} (nox sessions call these)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness.config import ConfigError, load_matrix
from harness.plan import build_plan, parse_only
from harness.shards import merge_runs, parse_shard, shard_plan
from harness.records import SchemaError
from harness.store import REPORTS

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "matrix.yaml"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="matrix file (default: matrix.yaml)")
    p.add_argument("--only", default=None, help="filter cells, e.g. torch=2.13.0,exporter=dynamo|torchscript")


def cmd_matrix(args: argparse.Namespace) -> int:
    from harness.execute import execute

    matrix = load_matrix(args.config)
    plan = build_plan(matrix, parse_only(args.only))
    if shard := parse_shard(args.shard):
        plan = shard_plan(plan, *shard)
    if not plan.cells:
        print(f"{args.config}: the filter leaves no cells to run", file=sys.stderr)
        return 2
    run_dir = execute(matrix, args.config, plan, args.output, args.reports, args.provider, args.resume)
    print(f"run directory: {run_dir}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.execute import finalize

    run_dir = merge_runs(args.runs, args.output)
    meta = json.loads((run_dir / "run.json").read_text())
    finalize(run_dir, meta, args.reports)
    print(f"merged {len(args.runs)} shard runs into {run_dir}")
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
    """Re-render report files from stored results; results.jsonl and run.json are only read."""
    from harness.report_html import write_reports, write_store_index
    from harness.store import load_run, resolve_run

    for ref in args.runs or ["latest"]:
        run_dir = resolve_run(ref, args.reports)
        meta, records = load_run(run_dir)
        path = write_reports(run_dir, records, meta, args.reports)
        print(f"{meta['run_id']}: {path} {path.with_name('matrix.html')}")
    if (args.reports / "index.json").exists():
        print(f"index: {write_store_index(args.reports)}")
    return 0


def _store_option(p: argparse.ArgumentParser) -> None:
    # Also accepted after the subcommand, where `nox -s report -- ...` puts it.
    p.add_argument("--reports", type=Path, default=argparse.SUPPRESS, help="results store (default: reports/)")


def cmd_publish(args: argparse.Namespace) -> int:
    from harness.report_html import write_site

    site = args.site or args.reports / "site"
    index = write_site(args.reports, site)
    print(f"site: {index.parent} (open {index})")
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate import GateRequest, run_gate
    from harness.gate_compare import Settings

    settings = Settings(args.latency_threshold, args.alpha, args.parity_factor)
    return run_gate(GateRequest(args.baseline, args.candidate, args.config, args.reports, args.output,
                                args.provider, settings, args.remeasure))


def _gate_parser(sub: argparse._SubParsersAction) -> None:
    from harness.gate_compare import DEFAULT_PARITY_FACTOR
    from harness.stats import DEFAULT_ALPHA, DEFAULT_RATIO

    p = sub.add_parser("gate", help="compare a candidate torch against a baseline; exit 1 on regression")
    p.add_argument("--baseline", required=True, help="torch version, run id/directory, or RUN@VERSION")
    p.add_argument("--candidate", required=True, help="torch version, run id/directory, or RUN@VERSION")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="matrix file (default: matrix.yaml)")
    p.add_argument("--output", type=Path, default=None, help="gate directory (default: reports/gates/<timestamp>)")
    p.add_argument("--provider", choices=["venv", "docker"], default="venv")
    p.add_argument("--latency-threshold", type=float, default=DEFAULT_RATIO,
                   help=f"median ratio above which a significant slowdown counts (default {DEFAULT_RATIO})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"Mann-Whitney p-value threshold (default {DEFAULT_ALPHA})")
    p.add_argument("--parity-factor", type=float, default=DEFAULT_PARITY_FACTOR,
                   help="max_abs may grow by this many atol before it counts as drift "
                        f"(default {DEFAULT_PARITY_FACTOR})")
    p.add_argument("--remeasure", type=int, default=2, metavar="N",
                   help="fresh processes per side to re-measure cells flagged slower (default 2; "
                        "0: count the first measurement)")
    _store_option(p)
    p.set_defaults(func=cmd_gate)


def _resolve_paths(args: argparse.Namespace) -> None:
    """Relative --config / --output / --reports are relative to where the user ran the command
    (nox changes into the project root before running a session)."""
    invoked = os.environ.get("HARNESS_INVOKED_FROM")
    if not invoked:
        return
    for name in ("config", "output", "reports"):
        value = getattr(args, name, None)
        if isinstance(value, Path) and not value.is_absolute():
            candidate = Path(invoked) / value
            if name != "config" or candidate.exists() or not value.exists():
                setattr(args, name, candidate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    parser.add_argument("--reports", type=Path, default=REPORTS, help="results store (default: reports/)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("matrix", help="run a matrix")
    _common(p)
    p.add_argument("--output", type=Path, default=None, help="run directory (default: reports/runs/<run-id>)")
    p.add_argument("--provider", choices=["venv", "docker"], default="venv")
    p.add_argument("--resume", action="store_true", help="continue the newest unfinished run")
    p.add_argument("--shard", default=None, help="run shard K of N (K/N): whole export groups, dealt round-robin")
    p.set_defaults(func=cmd_matrix)
    p = sub.add_parser("merge", help="merge finished shard runs into one run")
    p.add_argument("runs", nargs="+", type=Path, help="shard run directories")
    p.add_argument("--output", type=Path, required=True, help="directory of the merged run (must not exist)")
    p.set_defaults(func=cmd_merge)
    p = sub.add_parser("plan", help="print environments and cells without running them")
    _common(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("report", help="re-render reports from stored results")
    p.add_argument("runs", nargs="*", help="run ids or directories (default: latest)")
    _store_option(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("publish", help="write a static site of every run (GitHub Pages ready)")
    p.add_argument("--site", type=Path, default=None, help="output folder (default: reports/site)")
    _store_option(p)
    p.set_defaults(func=cmd_publish)
    _gate_parser(sub)
    args = parser.parse_args(argv)
    _resolve_paths(args)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, SchemaError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
