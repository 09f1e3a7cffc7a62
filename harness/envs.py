"""Environments: what each one installs (companion pins per torch), and the uv venv provider.

An environment is named by a hash of everything it installs; a venv whose marker file carries
that hash is reused as is (no resolver, no installer: a warm environment costs milliseconds).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from harness.runtimes import runtime_info

if TYPE_CHECKING:
    from harness.config import Matrix, RuntimeSpec, TorchSpec

ROOT = Path(__file__).resolve().parent.parent
MARKER = ".harness-env.json"


class EnvironmentBuildError(RuntimeError):
    """An environment could not be created or installed."""


def companion_pins(torch_version: str) -> dict[str, str]:
    """Default numpy / onnx / onnxscript / protobuf pins contemporary with a torch release.

    torch <= 2.3 was built against numpy 1.x. The dynamo exporter translates through onnxscript's
    torchlib, which moves with torch: a much newer onnxscript breaks an older torch (measured:
    torch 2.6 + onnxscript 0.7 fails to translate BatchNorm), and onnxscript < 0.3 writes bools
    into int attributes, which protobuf >= 6 rejects. Each row below was run on the probes.
    """
    v = Version(torch_version)
    if v < Version("2.4"):
        return {"numpy": "1.26.4", "onnx": "1.16.2", "onnxscript": "0.1.0", "protobuf": "4.25.8"}
    if v < Version("2.9"):
        return {"numpy": "2.2.6", "onnx": "1.17.0", "onnxscript": "0.2.7", "protobuf": "5.29.5"}
    return {"numpy": "2.4.6", "onnx": "1.23.2", "onnxscript": "0.7.2"}


@dataclass
class EnvSpec:
    name: str
    torch: str
    python: str
    family: str
    packages: list[str]
    runtimes: list[str]
    needs_gpu: bool = False
    runtime_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    find_links: list[str] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)

    @property
    def spec_hash(self) -> str:
        blob = json.dumps({"python": self.python, "packages": sorted(self.packages),
                           "find_links": self.find_links, "index_url": self.index_url,
                           "extra": self.extra_index_urls}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "torch": self.torch, "python": self.python, "family": self.family,
                "packages": self.packages, "runtimes": self.runtimes, "spec_hash": self.spec_hash}


def env_specs_for(torch_spec: "TorchSpec", rt: "RuntimeSpec", matrix: "Matrix") -> EnvSpec:
    """The environment that hosts runtime ``rt`` for ``torch_spec``.

    Runtimes of one family at their default versions share an environment; a runtime pinned to
    another version gets an environment of its own (two versions of a package cannot coexist).
    """
    info = runtime_info(rt.name)
    if rt.version is None:
        members = [r for r in matrix.runtimes
                   if r.version is None and runtime_info(r.name).family == info.family]
    else:
        members = [rt]
    pins = {**companion_pins(torch_spec.version),
            **{k: v for k, v in (("numpy", torch_spec.numpy), ("onnx", torch_spec.onnx),
                                 ("onnxscript", torch_spec.onnxscript),
                                 ("protobuf", torch_spec.protobuf)) if v}}
    packages = [f"torch=={torch_spec.version}"] + [_req(k, v) for k, v in sorted(pins.items())]
    for r in members:
        ri = runtime_info(r.name)
        packages.append(f"{ri.package}=={r.version or ri.default_version}")
        packages.extend(ri.extra_packages)
    packages.extend(torch_spec.extras)
    packages = list(dict.fromkeys(packages))
    install = matrix.install
    spec = EnvSpec(
        name="", torch=torch_spec.version, python=torch_spec.python or install.python,
        family=info.family, packages=packages, runtimes=[r.label for r in members],
        needs_gpu=any(runtime_info(r.name).needs_gpu for r in members),
        runtime_options={r.label: r.options for r in members},
        find_links=[p for p in dict.fromkeys([*install.find_links,
                                              *(pip_find_links() if install.use_pip_config and not info.needs_gpu else [])])
                    if Path(p).exists()],
        index_url=install.index_url, extra_index_urls=list(install.extra_index_urls),
    )
    suffix = "" if rt.version is None else f"-{rt.name}{rt.version}"
    spec.name = f"torch{torch_spec.version}-{info.family}{suffix}-{spec.spec_hash[:8]}"
    return spec


def pip_find_links() -> list[str]:
    """find-links folders from pip's own configuration (uv does not read it): wheels a machine
    keeps on disk, such as a CPU build of torch, are then used before downloading."""
    import configparser

    files = [Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"),
             Path.home() / ".config" / "pip" / "pip.conf", Path.home() / ".pip" / "pip.conf"]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    links: list[str] = []
    for path in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        for section in ("global", "install"):
            links += parser.get(section, "find-links", fallback="").split()
    links += os.environ.get("PIP_FIND_LINKS", "").split()
    return [link for link in links if not link.startswith(("http://", "https://"))]


def _req(name: str, value: str) -> str:
    return f"{name}{value}" if value[0] in "<>=!~" else f"{name}=={value}"


def envs_dir() -> Path:
    return Path(os.environ.get("HARNESS_ENVS_DIR", ROOT / ".envs"))


def uv_bin() -> str:
    found = shutil.which("uv")
    if found:
        return found
    candidate = Path(sys.executable).parent / "uv"
    if candidate.exists():
        return str(candidate)
    raise EnvironmentBuildError("uv is not installed: pip install uv (the project depends on it)")


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

    def ensure(self, spec: EnvSpec) -> dict[str, Any]:
        """Create the environment if needed; return its marker (installed packages, timings)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{spec.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two runs sharing .envs/ never build one env twice
            return self._ensure_locked(spec)

    def _ensure_locked(self, spec: EnvSpec) -> dict[str, Any]:
        if self.is_ready(spec):
            return {**json.loads((self.path(spec) / MARKER).read_text()), "reused": True}
        target = self.path(spec)
        if target.exists():
            shutil.rmtree(target)
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        uv = uv_bin()
        self._run([uv, "venv", "--quiet", "--python", spec.python, str(target)], spec)
        cmd = [uv, "pip", "install", "--python", str(self.python(spec)), *spec.packages]
        for link in spec.find_links:
            cmd += ["--find-links", link]
        if spec.index_url:
            cmd += ["--index-url", spec.index_url]
        for url in spec.extra_index_urls:
            cmd += ["--extra-index-url", url]
        self._run(cmd, spec)
        freeze = self._run([uv, "pip", "freeze", "--python", str(self.python(spec))], spec)
        marker = {**spec.to_dict(), "installed": freeze.split(), "created": time.time(),
                  "install_s": round(time.perf_counter() - t0, 2)}
        (target / MARKER).write_text(json.dumps(marker, indent=2))
        return {**marker, "reused": False}

    def _run(self, cmd: list[str], spec: EnvSpec) -> str:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise EnvironmentBuildError(f"environment {spec.name}: {' '.join(cmd[:3])} failed:\n{tail}")
        return proc.stdout

    def worker_command(self, spec: EnvSpec) -> list[str]:
        return [str(self.python(spec)), "-m", "harness.worker"]

    def worker_env(self, spec: EnvSpec, threads: int) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMP_NUM_THREADS", str(threads))
        return env
