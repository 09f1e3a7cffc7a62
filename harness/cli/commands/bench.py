"""`bench`: benchmark the tool itself (environment reuse, throughput, timing overhead)."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import _options as opts

HELP = "benchmark the tool itself (environment reuse, throughput, timing overhead)"


def _bench_matrix() -> Path:
    return Path(__file__).resolve().parents[2] / "matrices" / "bench.yaml"   # harness.bench.suite.BENCH_MATRIX


def add_arguments(p: argparse.ArgumentParser) -> None:
    opts.config(p, default=_bench_matrix(), label="harness/matrices/bench.yaml")
    p.add_argument("--part", action="append", default=None, metavar="NAME",
                   help="run only this benchmark (repeatable): env_reuse, latency_accuracy, matrix, timing_overhead, "
                        "plan_scaling, isolation, runtime_releases, interleaved, pipelines, blame_accuracy, default_matrix")
    p.set_defaults(func=run, only="torch=2.13.0")
    opts.store(p)


def run(args: argparse.Namespace) -> int:
    from harness.bench.suite import run_bench

    return run_bench(args.config, args.only, args.reports, args.part)
