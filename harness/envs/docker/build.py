"""Run one image build with BuildKit through the docker CLI.

The Docker SDK's build call uses the classic builder, which has no secrets, cache mounts or bind
mounts from the context; those are what keep the CA bundle and index settings out of layers and
share uv's download cache between images. So builds (only builds) go through the CLI: `docker
buildx build` where buildx is installed, else a client older than 23.0 with DOCKER_BUILDKIT=1
(Debian bookworm's docker.io), whose built-in Dockerfile frontend has the same RUN --mount support.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from harness.core.paths import HARNESS_DIR, IMAGES
from harness.envs.docker.images import Recipe, dockerfile, index_env, uv_binary
from harness.envs.provider import EnvironmentBuildError

CA_CANDIDATES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
DEFAULT_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Lines of a RUN step's output (BuildKit prefixes "#N seconds") that state an error: uv, apt, shell.
ERROR_LINE = re.compile(r"#\d+ [\d.]+ +(error:|cause:|ERROR|E: |×|╰─▶|.*: not found|base image has no)")


def _clients() -> list[str]:
    found = [shutil.which("docker"), "/usr/bin/docker", "/usr/local/bin/docker"]
    return list(dict.fromkeys(p for p in found if p and Path(p).exists()))


def builder_command() -> tuple[list[str], dict[str, str]]:
    """The build command prefix and extra environment that give a BuildKit build here."""
    for client in _clients():
        if subprocess.run([client, "buildx", "version"], capture_output=True).returncode == 0:
            return [client, "buildx", "build", "--load"], {}
    for client in _clients():
        out = subprocess.run([client, "version", "--format", "{{.Client.Version}}"],
                             capture_output=True, text=True).stdout.strip()
        major = out.split(".", 1)[0]
        if major.isdigit() and int(major) < 23:
            return [client, "build"], {"DOCKER_BUILDKIT": "1"}
    raise EnvironmentBuildError(
        "no BuildKit-capable docker client: install the buildx plugin (Debian: docker-buildx, "
        "Docker's repository: docker-buildx-plugin); BuildKit secrets and cache mounts are needed")


def ca_bundle() -> Path | None:
    for var in CA_CANDIDATES:
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return DEFAULT_CA if DEFAULT_CA.is_file() else None


def stage_context(context: Path, wheels: list[Path]) -> None:
    """Fill ``context`` with images/, harness/, wheels/ and tools/uv (wheels and uv hard-linked).

    A fixed folder per recipe rather than a temporary one lets BuildKit send only what changed.
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name, src in (("images", IMAGES), ("harness", HARNESS_DIR)):
        shutil.rmtree(context / name, ignore_errors=True)
        shutil.copytree(src, context / name, ignore=ignore)
    for folder, files in (("wheels", wheels), ("tools", [uv_binary()])):
        target = context / folder
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for src in files:
            try:
                os.link(src, target / src.name)
            except OSError:  # another filesystem: copy, keeping mtime so the context stays stable
                shutil.copy2(src, target / src.name)


def build_image(recipe: Recipe, tag: str, args: dict[str, str], wheels: list[Path],
                settings: dict[str, list[str]], work: Path, log_path: Path) -> float:
    """Build ``tag``; returns seconds taken. Raises EnvironmentBuildError with the log's tail."""
    prefix, extra_env = builder_command()
    context = work / f"context-{recipe.name}"
    context.mkdir(parents=True, exist_ok=True)
    stage_context(context, wheels)
    with tempfile.TemporaryDirectory(prefix="harness-secrets-") as secrets:
        index = Path(secrets) / "index.env"
        index.write_text(index_env(settings))
        index.chmod(0o600)
        ca = ca_bundle()
        cmd = [*prefix, "--network", "host", "--progress", "plain",
               "-f", str(context / "images" / dockerfile(recipe).name), "-t", tag,
               "--secret", f"id=index,src={index}"]
        if ca is not None:
            cmd += ["--secret", f"id=ca,src={ca}"]
        for key, value in args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        cmd.append(str(context))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, **extra_env})
    seconds = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        lines = log_path.read_text().strip().splitlines()
        # The tool's own error (uv's, apt's) says more than BuildKit's "executor failed" after it.
        errors = [ln.split(" ", 2)[-1].strip() for ln in lines if ERROR_LINE.match(ln)]
        cause = " ".join(errors)[:400] if errors else (lines[-1] if lines else "no output")
        tail = "\n".join(lines[-20:])
        raise EnvironmentBuildError(f"docker build of {tag} failed: {cause} (log: {log_path})\n{tail}")
    return seconds
