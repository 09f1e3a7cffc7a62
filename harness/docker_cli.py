"""python -m harness.docker_cli {images,base-image}: the nox sessions `images` and `base-image`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.cli import DEFAULT_CONFIG
from harness.config import ConfigError, load_matrix
from harness.envs import EnvironmentBuildError
from harness.plan import build_plan, parse_only


def cmd_images(args: argparse.Namespace) -> int:
    """Build the image of every environment the (filtered) plan needs; existing tags are kept."""
    from harness.docker_provider import DockerProvider

    plan = build_plan(load_matrix(args.config), parse_only(args.only))
    from rich.console import Console

    provider = DockerProvider(log=Console(stderr=True).print)
    built = failed = 0
    for env_plan in plan.environments:
        spec = env_plan.env
        if why := provider.skip_reason(spec):
            print(f"skip {spec.name}: {why}")
            continue
        try:
            marker = provider.ensure(spec)
        except EnvironmentBuildError as exc:
            print(f"error: {spec.name}: {exc}", file=sys.stderr)
            failed += 1
            continue
        built += not marker["reused"]
        print(f"{spec.name}: {marker['image']}" + ("" if marker["reused"] else
                                                   f" (built in {marker['install_s']} s)"))
    if not built and not failed:
        print("up to date")
    return 1 if failed else 0


def cmd_base_image(args: argparse.Namespace) -> int:
    """Bootstrap the local Debian base image (debootstrap + docker import) unless it exists."""
    from harness.docker_base import LOCAL_BASE, bootstrap_base
    from harness.docker_provider import DockerUnavailable, docker_client

    try:
        client = docker_client()
    except DockerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bootstrap_base(client, args.name or LOCAL_BASE, mirror=args.mirror, force=args.force)
    print(f"base image ready in {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.docker_cli", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("images", help="build the Docker images a matrix needs")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--only", default=None, help="filter, e.g. torch=2.13.0,runtime=ort-cpu")
    p.set_defaults(func=cmd_images)
    p = sub.add_parser("base-image", help="bootstrap the local base image for offline builds")
    p.add_argument("--name", default=None, help="image name (default: the one builds fall back to)")
    p.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses)")
    p.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    p.set_defaults(func=cmd_base_image)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
