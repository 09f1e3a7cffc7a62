"""`advise`: which configuration to ship a case to a runtime, from stored results."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import _options as opts

HELP = "which torch / exporter / opset / options to ship a case with, per runtime"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", required=True, help="the case's name, as in cell ids (e.g. conv_bn)")
    p.add_argument("--runtime", default=None, help="one runtime label (e.g. ort-cpu; default: every runtime)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--run", default=None,
                        help="advise from this run only (id, directory or 'latest')")
    source.add_argument("--store", type=Path, default=None,
                        help="advise from every finished run of this store, newest record per cell "
                             "(default: the --reports store)")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.matrix.rules import ConfigError
    from harness.report.advise import RULE, advice_lines, advise, losses, store_records
    from harness.store.runs import load_run, resolve_run

    sources = None
    if args.run is not None:
        try:
            run_dir = resolve_run(args.run, args.reports)
        except FileNotFoundError as exc:
            raise ConfigError(f"--run: {exc}") from None
        meta, records = load_run(run_dir)
        where = f"run {meta.run_id}"
    else:
        store = args.store or args.reports
        if not (store / "runs").is_dir():
            raise ConfigError(f"--store: {store} holds no runs (expected a results store with runs/)")
        stored = store_records(store)
        records, sources = stored.records, stored.sources
        where = f"{stored.scanned} finished run(s) of {store}"
    cases = sorted({r.case for r in records})
    if args.case not in cases:
        why = ""
        if args.run is None:    # what the store holds of the case, and why none of it was usable
            from harness.store.reuse import ADVISE, Wanted, nothing_usable

            why = f"; {nothing_usable(ADVISE, args.store or args.reports, Wanted(base_dir_of_run=True), case=args.case)}"
        raise ConfigError(f"--case: no case {args.case!r} in {where} (cases: {', '.join(cases) or 'none'}){why}")
    mine = [r for r in records if r.case == args.case]
    runtimes = sorted({r.runtime for r in mine})
    if args.runtime is not None and args.runtime not in runtimes:
        raise ConfigError(f"--runtime: case {args.case} has no cells on {args.runtime!r} in {where} "
                          f"(runtimes: {', '.join(runtimes)})")
    lost = losses(mine, sources)
    chosen = advise(mine, args.case, args.runtime, sources)
    several = len({a.source for a in chosen}) > 1
    print(f"advice for {args.case} from {where}; rule: {RULE}")
    if several:
        print(f"{len({a.source for a in chosen})} different cases are named {args.case} here (different "
              "case sources): each is ranked on its own")
    for adv in chosen:
        print()
        print("\n".join(advice_lines(adv, [x for x in lost if x.runtime == adv.runtime and x.source == adv.source],
                                      name_source=several)))
    return 0

