"""`history`: the nightly history (one compact file per night): append a run, publish the site,
check freshness. The nightly workflow calls these three; they run the same way locally."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import _options as opts
from harness.cli._options import ConfigError
from harness.cli.logger import say

HELP = "keep every night: append a run to the history, publish its site, check it is current"
ACTIONS = ("append", "publish", "check")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=ACTIONS,
                   help="append: a finished run becomes a night file; publish: write the site of every "
                   "night; check: exit 1 when the newest night is older than --max-age-hours or its "
                   "nightly failed")
    p.add_argument("--nights", type=Path, default=None,
                   help="folder of night files (default: reports/nights; the workflow: the results branch)")
    p.add_argument("--run", default="latest", help="append: the run (id or directory; default: latest)")
    p.add_argument("--night", default=None, metavar="YYYY-MM-DD",
                   help="append: the night's name (default: the run's UTC start date)")
    p.add_argument("--outcome", default="unknown",
                   help="append: how the nightly ended (success, failure, cancelled, skipped, unknown)")
    p.add_argument("--url", default=None, help="append: the nightly's page (its logs and bundles), an http(s) link")
    p.add_argument("--no-run", action="store_true",
                   help="append: record a nightly that produced no run (with its --outcome, e.g. failure): "
                   "the site names it among the nightlies that failed, check fails on it")
    p.add_argument("--site", type=Path, default=None, help="publish: output folder (default: reports/site)")
    p.add_argument("--max-age-hours", type=float, default=None, metavar="H",
                   help="publish, check: a night older than this is stale (default: 36)")
    opts.config(p, only=False, label="matrix.yaml, the nightly's")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import math

    from harness.report.history import DEFAULT_MAX_AGE_H, freshness, write_history_site
    from harness.store.nights import nights_folder, scan_nights
    from harness.store.nights_append import append_failed_night, append_night
    from harness.store.runs import resolve_run

    nights = nights_folder(args.nights or args.reports / "nights")
    max_age = DEFAULT_MAX_AGE_H if args.max_age_hours is None else args.max_age_hours
    if not math.isfinite(max_age) or max_age <= 0:
        raise ConfigError(f"--max-age-hours: expected a number of hours > 0 (got {args.max_age_hours!r})")
    if args.action == "append" and args.no_run:
        path = append_failed_night(nights, args.outcome, args.url, args.night)
        print(f"night: {path} (no run: {args.outcome})")
        return 0
    if args.action == "append":
        run_dir = resolve_run(args.run, args.reports)
        path, written = append_night(run_dir, nights, args.night, args.outcome, args.url, args.config)
        size = path.stat().st_size
        print(f"{'night' if written else 'already recorded'}: {path} ({size / 1024:.1f} KiB)")
        return 0
    # One damaged night is named and skipped; a damaged newest night means the history's state
    # cannot be told (exit 2), after the site of the others is written.
    scan = scan_nights(nights, warn=say)
    if args.action == "publish":
        index = write_history_site(nights, args.site or args.reports / "site", max_age, scan=scan)
        print(f"site: {index.parent} (open {index})")
    if scan.newest_damaged:
        raise ConfigError(f"the newest night file cannot be read, so whether the history is current cannot "
                          f"be told: {scan.newest_damaged}")
    if args.action == "publish":
        return 0
    fresh = freshness(scan.nights, max_age)
    where = "" if scan.files else f" (no night file in {nights}; `history append` adds one)"
    print(("current: " if fresh.ok else "NOT CURRENT: ") + fresh.line() + where)
    return 0 if fresh.ok else 1
