"""`base-image`: bootstrap the local base image for offline builds."""
from __future__ import annotations

import argparse
import sys

HELP = "bootstrap the local base image for offline builds"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=None, help="image name (default: the one builds fall back to)")
    p.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses)")
    p.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Bootstrap the local Debian base image (debootstrap + docker import) unless it exists."""
    import time

    from harness.envs.docker.base import LOCAL_BASE, bootstrap_base
    from harness.envs.docker.provider import DockerUnavailable, docker_client

    try:
        client = docker_client()
    except DockerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bootstrap_base(client, args.name or LOCAL_BASE, mirror=args.mirror, force=args.force)
    print(f"base image ready in {time.perf_counter() - t0:.1f} s")
    return 0
