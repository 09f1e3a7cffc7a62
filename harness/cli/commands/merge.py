"""`merge`: merge finished shard runs into one run."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import _options as opts
from harness.cli._options import ConfigError

HELP = "merge finished shard runs into one run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, help="shard run directories (every shard of one split)")
    p.add_argument("--output", type=Path, required=True,
                   help="directory of the merged run (must not exist or be empty)")
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                   help="wait up to this long for shards still running (Kubernetes; default 0)")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.run_workflow import finish_merged
    from harness.store.merge import merge_runs

    if args.wait < 0:
        raise ConfigError(f"--wait: expected seconds >= 0 (got {args.wait})")
    run_dir = merge_runs(args.runs, args.output, wait_s=args.wait)
    finish_merged(run_dir, args.reports)
    print(f"merged {len(args.runs)} shard runs into {run_dir}")
    return 0
