"""`gpu-check`: run the probes on the GPU runtimes and print one line per cell."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import _options as opts

HELP = "run the probes on the GPU runtimes and print one line per cell"


def add_arguments(p: argparse.ArgumentParser) -> None:
    opts.config(p, default=Path(__file__).resolve().parents[2] / "matrices" / "gpu.yaml", only=False,
                label="harness/matrices/gpu.yaml")
    p.add_argument("--output", type=Path, default=None, help="run directory (default: a temporary one)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.gpu_check import run_gpu_check

    return run_gpu_check(args.config, args.output)
