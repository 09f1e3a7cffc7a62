"""`plan`: print environments and cells without running them; shard them for CI."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.cli import _options as opts
from harness.cli._options import ConfigError
from harness.cli.commands.matrix import _request
from harness.core.text import ENCODE_ERRORS

HELP = "print environments and cells without running them; shard them for CI"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.matrix.engines import GPU_RUNNER, HOSTED_RUNNER

    opts.config(p)
    opts.shard(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="split into N shards (fewer when more would not shorten the longest one)")
    p.add_argument("--format", choices=("text", "json", "github", "k8s"), default="text",
                   help="text (default), json (shards with their cells and durations), github "
                        "(strategy.matrix JSON), k8s (Indexed Job manifests)")
    p.add_argument("--min-shard-cells", type=int, default=1, metavar="M",
                   help="at most one shard per M cells: a small matrix stays one job (default 1)")
    p.add_argument("--cpu-runner-label", default=HOSTED_RUNNER,
                   help=f"runs-on of CPU shards (default {HOSTED_RUNNER})")
    p.add_argument("--gpu-runner-label", default=GPU_RUNNER,
                   help=f"runs-on of GPU shards, comma-separated labels (default {GPU_RUNNER}); empty: "
                        "no GPU runner, GPU shards run on the CPU label and their GPU cells are skips")
    p.add_argument("--image", default="torch-onnx-matrix:latest",
                   help="k8s: image holding this checkout as its working directory (pip install -e .)")
    p.add_argument("--pvc", default="torch-onnx-matrix-runs", help="k8s: shared volume claim for shard runs")
    p.add_argument("--storage", default="200Gi", help="k8s: size of that claim (default 200Gi)")
    p.add_argument("--gpu-resource", default="",
                   help="k8s: resource GPU shards request, e.g. nvidia.com/gpu (a second Indexed Job)")
    p.add_argument("--output", type=Path, default=None, help="write to this file instead of stdout")
    opts.store(p)
    p.set_defaults(func=run)


def _print_plan(plan: Any, out: Any) -> None:
    # What each `cases:` glob took and what it left out, with why (a glob never drops silently).
    for glob in plan.matrix.globs:
        for line in glob.lines():
            print(line, file=out)
    for env in plan.environments:
        spec = env.env
        what = (f"existing {spec.existing.where}, torch {spec.existing.torch}" if spec.existing
                else ' '.join(spec.packages))
        print(f"{spec.name}: {what}", file=out)
        for label, why in spec.absent.items():
            print(f"  {label}: skipped: {why}", file=out)
        for cell in env.cells:
            print(f"  {cell.cell_id}", file=out)
    print(f"{len(plan.cells)} cells in {len(plan.environments)} environments", file=out)


def _plan_args(args: argparse.Namespace) -> list[str]:
    """The arguments that decide the plan, as a shard job passes them (--config relative to the
    checkout when it lies inside it, so a job in another checkout or an image finds it)."""
    from harness.core.paths import WORKSPACE

    config = args.config.resolve()
    out = ["--config", str(config.relative_to(WORKSPACE) if config.is_relative_to(WORKSPACE) else config)]
    if args.only:
        out += ["--only", args.only]
    if args.torch:
        out += ["--torch", args.torch]
    return out


def run(args: argparse.Namespace) -> int:
    """The plan as text (optionally one shard of it), or sharded for an engine (json, github, k8s)."""
    import contextlib
    import json

    from harness.matrix.engines import github_matrix, plan_document, render_k8s
    from harness.matrix.shards import balance, shard_count
    from harness.matrix_run import load_request_matrix, plan_for, plan_shards

    if args.shard and args.shards is not None:
        raise ConfigError("plan: give --shard K/N (one shard's cells) or --shards N (the split), not both")
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(args.output, "w", encoding="utf-8", errors=ENCODE_ERRORS)) if args.output else sys.stdout
        if args.format == "text" and args.shards is None:
            _print_plan(plan_for(_request(args)), out)
            return 0
        if args.shard:
            raise ConfigError(f"plan: --shard prints one shard as text; for --format {args.format} "
                              "give --shards N")
        _, whole = load_request_matrix(_request(args))
        requested = 1 if args.shards is None else args.shards
        count = shard_count(whole, requested, args.min_shard_cells) if whole.cells else requested
        plan, shards, costs = plan_shards(_request(args), count)
        if args.format == "github":
            print(json.dumps(github_matrix(shards, args.cpu_runner_label, args.gpu_runner_label),
                             separators=(",", ":")), file=out)
            return 0
        document = plan_document(plan, shards, costs, _plan_args(args), args.cpu_runner_label,
                                 args.gpu_runner_label)
        if args.format == "json":
            print(json.dumps(document, indent=1), file=out)
        elif args.format == "k8s":
            print(render_k8s(document, args.image, args.pvc, args.storage, args.gpu_resource or None),
                  end="", file=out)
        else:
            b = balance(shards)
            for s in shards:
                runs_on = document["shards"][s.index - 1]["runs-on"]
                runs_on = runs_on if isinstance(runs_on, str) else ",".join(runs_on)
                print(f"shard {s.label}: {len(s.cells)} cells, ~{s.estimated_s:.0f} s, runs-on "
                      f"{runs_on}: {' '.join(s.environments)}", file=out)
            print(f"{len(plan.cells)} cells in {len(shards)} shards; largest/mean {b['ratio']} "
                  f"(durations: {costs.source})", file=out)
    return 0
