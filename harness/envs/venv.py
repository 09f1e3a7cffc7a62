"""The uv venv provider: an ``EnvSpec`` realised as a virtualenv under .envs/.

An environment is named by a hash of everything it installs; a venv whose marker file carries
that hash is reused as is (no resolver, no installer: a warm environment costs milliseconds).
"""
from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import time
from pathlib import Path

from harness.core.env import EnvMarker, EnvSpec
from harness.core.paths import envs_dir
from harness.core.wire import WORKER_MODULE
from harness.envs.provider import EnvironmentBuildError, cannot_create, harness_process_env, uv_bin
from harness.runtimes import gpu_unavailable_reason

MARKER = ".harness-env.json"


class VenvProvider:
    """Realises an EnvSpec as a uv virtualenv under .envs/, reused while its hash is unchanged."""

    name = "venv"

    def __init__(self, root: Path | None = None, log=print) -> None:
        self.root = root or envs_dir()
        self.log = log

    def path(self, spec: EnvSpec) -> Path:
        return self.root / spec.name

    def python(self, spec: EnvSpec) -> Path:
        return self.path(spec) / "bin" / "python"

    def is_ready(self, spec: EnvSpec) -> bool:
        marker = self.path(spec) / MARKER
        try:
            return json.loads(marker.read_text())["spec_hash"] == spec.spec_hash and self.python(spec).exists()
        except (OSError, ValueError, KeyError):
            return False

    def skip_reason(self, spec: EnvSpec) -> str | None:
        return gpu_unavailable_reason() if spec.needs_gpu else None

    def ensure(self, spec: EnvSpec) -> EnvMarker:
        """Create the environment if needed; return its marker (installed packages, timings).
        A folder that cannot be made (a file where it goes, no permission, a full disk) is an
        ``EnvironmentBuildError`` like a failed install."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / f".{spec.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # two runs sharing .envs/ never build one env twice
                return self._ensure_locked(spec)
        except OSError as exc:
            raise EnvironmentBuildError(cannot_create(spec.name, exc)) from exc

    def _ensure_locked(self, spec: EnvSpec) -> EnvMarker:
        if self.is_ready(spec):
            marker = EnvMarker.from_dict(json.loads((self.path(spec) / MARKER).read_text()))
            marker.reused = True
            return marker
        target = self.path(spec)
        if target.exists():
            shutil.rmtree(target)
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        uv = uv_bin()
        self._run([uv, "venv", "--quiet", "--python", spec.python, str(target)], spec)
        cmd = [uv, "pip", "install", "--python", str(self.python(spec)), *spec.packages, *spec.index_args()]
        self._run(cmd, spec)
        freeze = self._run([uv, "pip", "freeze", "--python", str(self.python(spec))], spec)
        marker = EnvMarker.for_spec(spec, installed=freeze.split(),
                                    install_s=round(time.perf_counter() - t0, 2),
                                    extra={"created": time.time()})
        (target / MARKER).write_text(json.dumps(marker.to_dict(), indent=2))
        return marker

    def _run(self, cmd: list[str], spec: EnvSpec) -> str:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise EnvironmentBuildError(f"environment {spec.name}: {' '.join(cmd[:3])} failed:\n{tail}")
        return proc.stdout

    def worker_command(self, spec: EnvSpec) -> list[str]:
        return [str(self.python(spec)), "-m", WORKER_MODULE]

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        env = harness_process_env(threads)
        env.pop("VIRTUAL_ENV", None)
        return env
