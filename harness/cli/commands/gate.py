"""`gate`: compare a candidate torch against a baseline; exit 1 on regression."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from harness.cli import _options as opts
from harness.cli._options import ConfigError
from harness.cli.logger import say

HELP = "compare a candidate torch against a baseline; exit 1 on regression"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.gate.compare import Settings
    from harness.gate.driver import GateRequest

    ratio, alpha, parity, confidence = (opts.default_of(Settings, k) for k in
                                        ("latency_threshold", "alpha", "parity_factor", "confidence"))
    p.add_argument("--baseline", default=None, help="torch version, run id/directory, or RUN@VERSION")
    p.add_argument("--candidate", default=None, help="torch version, run id/directory, or RUN@VERSION")
    p.add_argument("--from-deps", default=None, metavar="BASE_REF",
                   help="baseline: the torch the dependency files pin at this git ref (the target "
                        "branch); candidate: the one the working tree pins (requirements*.txt, "
                        "pyproject.toml, uv.lock, poetry.lock, Pipfile.lock); no bump: exit 0")
    p.add_argument("--package", default=None, metavar="NAME",
                   help="compare two releases of this package (--baseline/--candidate are its versions) "
                        "with torch held fixed: onnxscript, onnx, numpy, protobuf or a torch entry's extras")
    p.add_argument("--baseline-env", default=None, metavar="ENV",
                   help="baseline: an existing environment, used as it is: an interpreter (path to python, "
                        "or a venv's folder) or a Docker image on this machine; with --candidate-env")
    p.add_argument("--candidate-env", default=None, metavar="ENV",
                   help="candidate: an existing environment (interpreter or local image); the gate "
                        "compares the two, whatever torch each holds")
    opts.config(p, only=False)
    p.add_argument("--output", type=Path, default=None, help="gate directory (default: reports/gates/<timestamp>)")
    p.add_argument("--provider", choices=opts.PROVIDERS, default=opts.default_of(GateRequest, "provider"))
    p.add_argument("--latency-threshold", type=float, default=ratio,
                   help=f"ratio the whole interval of an interleaved timing must exceed to count as slower "
                        f"(default {ratio})")
    p.add_argument("--confidence", type=float, default=confidence,
                   help=f"confidence of that interval (default {confidence})")
    p.add_argument("--alpha", type=float, default=alpha,
                   help=f"Mann-Whitney p-value threshold of the first look on stored figures (default {alpha})")
    p.add_argument("--parity-factor", type=float, default=parity,
                   help="max_abs may grow by this many atol before it counts as drift "
                        f"(default {parity})")
    p.add_argument("--block-on", action="append", choices=["io"], default=[],
                   help="also block on graph drift: 'io' = a change of input/output names or dynamic dims")
    remeasure = opts.default_of(GateRequest, "remeasure")
    p.add_argument("--remeasure", type=int, default=remeasure, metavar="N",
                   help=f"time the cells whose stored latencies differ interleaved, in at least N fresh "
                        f"process sets (default {remeasure}); 0: the stored figures decide")
    share = opts.default_of(Settings, "min_compared")
    p.add_argument("--min-compared", type=opts.share, default=share, metavar="SHARE",
                   help="share of the cells either side planned (less those skipped wherever they ran) that must be compared, "
                        f"as 0.9 or 90%% (default {share * 100:g}%%); below it the gate exits 2: it cannot tell")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.gate.compare import Settings
    from harness.gate.driver import GateRequest
    from harness.gate.torch_gate import run_gate

    baseline, candidate, config = args.baseline, args.candidate, args.config
    if args.baseline_env is not None or args.candidate_env is not None:
        if not (args.baseline_env and args.candidate_env) or baseline or candidate or args.package \
                or args.from_deps is not None:
            raise ConfigError("gate: expected both --baseline-env and --candidate-env (and none of "
                              "--baseline, --candidate, --package, --from-deps)")
        from harness.gate.environments import run_env_gate

        settings = Settings(args.latency_threshold, args.alpha, args.parity_factor,
                            tuple(args.block_on or ()), args.min_compared)
        return run_env_gate(GateRequest(args.baseline_env, args.candidate_env, config, args.reports,
                                        args.output, args.provider, settings, args.remeasure))
    if args.package is not None:
        if args.from_deps is not None or not (baseline and candidate):
            raise ConfigError("gate --package NAME: expected --baseline and --candidate versions of it "
                              "(and no --from-deps)")
        from harness.gate.packages import PackageBump, run_package_gate

        settings = Settings(args.latency_threshold, args.alpha, args.parity_factor,
                            tuple(args.block_on or ()), args.min_compared, args.confidence)
        return run_package_gate(GateRequest(baseline, candidate, config, args.reports, args.output,
                                            args.provider, settings, args.remeasure),
                                PackageBump(args.package, baseline, candidate))
    if args.from_deps is not None:
        if baseline or candidate:
            raise ConfigError("gate: give --from-deps BASE_REF or --baseline/--candidate, not both")
        from harness.gate.deps import gate_matrix, read_sides

        sides = read_sides(args.from_deps, Path.cwd())
        say(sides.describe())
        if not sides.bump:
            message = (f"torch is {sides.candidate.torch} on both sides ({args.from_deps} and this "
                       "change): no torch bump, nothing to gate.")
            print(message)
            if summary := os.environ.get("GITHUB_STEP_SUMMARY"):
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(f"## Upgrade gate\n\n{message}\n")
            return 0
        if args.output is None:
            args.output = args.reports / "gates" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        config = gate_matrix(sides, args.config, args.output)
        baseline, candidate = sides.baseline.torch, sides.candidate.torch
        from harness.matrix.deps import public

        baseline, candidate = public(baseline), public(candidate)
    elif not (baseline and candidate):
        raise ConfigError("gate: expected --baseline and --candidate (or --from-deps BASE_REF)")
    settings = Settings(args.latency_threshold, args.alpha, args.parity_factor, tuple(args.block_on or ()),
                        args.min_compared, args.confidence)
    return run_gate(GateRequest(baseline, candidate, config, args.reports, args.output,
                                args.provider, settings, args.remeasure))
