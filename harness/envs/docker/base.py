"""Base images: use the public base a Dockerfile names, or a locally bootstrapped Debian one.

Machines behind a proxy or offline often cannot pull from Docker Hub / nvcr.io, but can reach a
Debian mirror. `bootstrap_base` builds a minimal bookworm root (debootstrap minbase + python3 +
python3-venv) and imports it as LOCAL_BASE; every Dockerfile under images/ builds on it unchanged
through the BASE_IMAGE build argument.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from harness.envs.provider import EnvironmentBuildError

LOCAL_BASE = "torch-onnx-matrix/base:bookworm"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# python3 + venv (bookworm's python3 is 3.11); ca-certificates for TLS in the builds on top.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")


def debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (one-line or deb822 sources), else the default."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for match in re.finditer(r"(?:^deb\s+(?:\[[^\]]*\]\s+)?|^URIs:\s*)(\S+)", text, re.M):
            uri = match.group(1).rstrip("/")
            if uri.endswith("/debian"):  # not debian-security: debootstrap wants the main archive
                return uri
    return DEFAULT_MIRROR


def image_exists(client, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def try_pull(client, name: str) -> str | None:
    """Pull ``name``; None on success, otherwise the registry's reason (offline, proxy, auth)."""
    import docker.errors

    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    try:
        client.images.pull(repo, tag=tag)
        return None
    except (docker.errors.APIError, OSError) as exc:
        text = getattr(exc, "explanation", None) or str(exc)
        return str(text).strip().splitlines()[0][:300] if text else type(exc).__name__


def bootstrap_base(client, name: str = LOCAL_BASE, mirror: str | None = None,
                   log: Callable[[str], Any] = print, force: bool = False) -> dict[str, Any]:
    """Create ``name`` from a debootstrap'ed Debian root unless it exists; returns what was done."""
    if not force and image_exists(client, name):
        log(f"base image {name}: up to date")
        return {"image": name, "built": False}
    if shutil.which("debootstrap") is None:
        raise EnvironmentBuildError(
            f"cannot bootstrap base image {name}: debootstrap is not installed "
            "(apt-get install debootstrap)")
    mirror = mirror or debian_mirror()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="harness-base-") as tmp:
        root = Path(tmp) / "root"
        log(f"base image {name}: debootstrap {SUITE} from {mirror} (a few minutes)")
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
               SUITE, str(root), mirror]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-15:])
            raise EnvironmentBuildError(f"debootstrap failed (needs root and {mirror}):\n{tail}")
        # Package caches and lists are dead weight in every image built on top.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        tarball = Path(tmp) / "root.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tarball), "."],
                       check=True)
        repo, _, tag = name.rpartition(":")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=tag,
                                          changes=['CMD ["/bin/bash"]'])
    seconds = round(time.perf_counter() - t0, 1)
    log(f"base image {name}: bootstrapped in {seconds} s")
    return {"image": name, "built": True, "seconds": seconds}
