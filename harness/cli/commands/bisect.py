"""`bisect`: find the torch release where a cell's verdict changes."""
from __future__ import annotations

import argparse

from harness.cli import _options as opts

HELP = "find the torch release where a cell's verdict changes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", default=None, help="cell id (with or without its torch part) or key name; "
                                                "default: every cell of --config")
    p.add_argument("--good", required=True, help="torch release with the good verdict")
    p.add_argument("--bad", required=True, help="torch release with the bad verdict (older than --good for a fix)")
    opts.config(p, only=False)
    p.add_argument("--releases", default=None,
                   help="comma-separated releases to search instead of asking the package index")
    p.add_argument("--provider", choices=opts.PROVIDERS, default="venv")
    p.add_argument("--package", default=None, metavar="NAME",
                   help="search this package's releases (--good/--bad are its versions) with torch held: "
                        "onnxscript, onnx, numpy, protobuf or a torch entry's extras")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.gate.bisect import BisectRequest, run_bisect
    from harness.gate.packages import run_package_bisect

    releases = [v.strip() for v in args.releases.split(",") if v.strip()] if args.releases else None
    req = BisectRequest(args.good, args.bad, args.config, args.reports, args.cell, releases, args.provider, args.package)
    return (run_bisect if args.package is None else run_package_bisect)(req)
