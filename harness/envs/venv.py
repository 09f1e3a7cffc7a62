"""The uv venv provider: an ``EnvSpec`` realised as a virtualenv under .envs/.

An environment is named by a hash of everything it installs; a venv whose marker file carries
that hash is reused as is (no resolver, no installer: a warm environment costs milliseconds).

Its packages are compiled to bytecode when they are installed (``uv pip install
--compile-bytecode``, what pip does by default and uv leaves out): every worker process imports
torch, and without ``.pyc`` files, or where ``PYTHONDONTWRITEBYTECODE`` keeps Python from writing
them, each one compiles torch's sources again (17 s instead of 7 s per worker start on a 2-core
machine). An environment built before this is compiled once, the next time it is used.
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
# The marker's fact that the site-packages hold bytecode (absent in environments built before).
BYTECODE = "bytecode"


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
            stored = json.loads((self.path(spec) / MARKER).read_text())
            if not stored.get(BYTECODE):
                self._compile(spec)
                stored[BYTECODE] = True
                try:
                    (self.path(spec) / MARKER).write_text(json.dumps(stored, indent=2))
                except OSError:
                    pass    # a read-only environment is used as it is, compiled or not
            marker = EnvMarker.from_dict(stored)
            marker.reused = True
            return marker
        target = self.path(spec)
        if target.exists():
            shutil.rmtree(target)
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        uv = uv_bin()
        self._run([uv, "venv", "--quiet", "--python", spec.python, str(target)], spec)
        cmd = [uv, "pip", "install", "--compile-bytecode", "--python", str(self.python(spec)), *spec.packages,
               *spec.index_args()]
        self._run(cmd, spec)
        freeze = self._run([uv, "pip", "freeze", "--python", str(self.python(spec))], spec)
        marker = EnvMarker.for_spec(spec, installed=freeze.split(),
                                    install_s=round(time.perf_counter() - t0, 2),
                                    extra={"created": time.time(), BYTECODE: True})
        (target / MARKER).write_text(json.dumps(marker.to_dict(), indent=2))
        return marker

    def _compile(self, spec: EnvSpec) -> None:
        """Compile an environment built without bytecode (the standard library's compileall, in
        the environment's own Python, offline). Best effort: a file that does not compile under
        this Python (a test module written for a newer one) is left as it is, as uv leaves it."""
        self.log(f"{spec.name}: compiling its packages to bytecode (once; built without it)")
        for site in sorted(self.path(spec).glob("lib/python*/site-packages")):
            subprocess.run([str(self.python(spec)), "-m", "compileall", "-q", "-j", "0", str(site)],
                           capture_output=True, text=True)

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
