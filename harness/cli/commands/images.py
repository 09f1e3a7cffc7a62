"""`images`: build the Docker images a matrix needs."""
from __future__ import annotations

import argparse
import sys

from harness.cli import _options as opts
from harness.cli.commands.matrix import _request
from harness.cli.logger import console

HELP = "build the Docker images a matrix needs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    opts.config(p)
    opts.shard(p)
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the image of every environment the (filtered) plan needs; existing tags are kept."""
    from harness.envs.docker.provider import DockerProvider
    from harness.envs.provider import EnvironmentBuildError
    from harness.matrix_run import plan_for

    plan = plan_for(_request(args))
    provider = DockerProvider(log=console.print)
    built = failed = 0
    for env_plan in plan.environments:
        spec = env_plan.env
        if spec.existing is not None:
            print(f"skip {spec.name}: an existing environment ({spec.existing.where}): nothing to build")
            continue
        if why := provider.skip_reason(spec):
            print(f"skip {spec.name}: {why}")
            continue
        try:
            marker = provider.ensure(spec)
        except EnvironmentBuildError as exc:
            print(f"error: {spec.name}: {exc}", file=sys.stderr)
            failed += 1
            continue
        built += not marker.reused
        print(f"{spec.name}: {marker.extra['image']}" + ("" if marker.reused else
                                                         f" (built in {marker.install_s} s)"))
    if not built and not failed:
        print("up to date")
    return 1 if failed else 0
