"""`publish`: write a static site of every run (GitHub Pages ready)."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import _options as opts

HELP = "write a static site of every run (GitHub Pages ready)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", type=Path, default=None, help="output folder (default: reports/site)")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.report.html import write_site

    site = args.site or args.reports / "site"
    index = write_site(args.reports, site)
    print(f"site: {index.parent} (open {index})")
    return 0
