"""Runtime-only environments: one runtime release, numpy and onnx, no torch.

They run files exported elsewhere (a cell's spool): adding a runtime release to a matrix costs a
load and a run per file, never an export. Each is an ordinary uv venv under the environments
cache, named by what it installs, so a release tried once is reused by every later run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from harness.core.env import EnvMarker, EnvSpec
from harness.envs.provider import EnvironmentBuildError
from harness.envs.venv import VenvProvider
from harness.runtimes import RUNTIMES

# Wheels built against numpy 1.x that fail to import under numpy 2 ("_ARRAY_API not found"):
# below these releases the environment pins numpy<2.
NUMPY2_SINCE = {"onnxruntime": Version("1.19.0"), "openvino": Version("2024.3.0")}


@dataclass(frozen=True)
class RuntimeRelease:
    """One release of one runtime, installed on its own."""

    runtime: str      # a name in RUNTIMES, e.g. "ort-cpu"
    version: str      # a release of its package, e.g. "1.18.1"

    @property
    def package(self) -> str:
        return RUNTIMES[self.runtime].package

    @property
    def label(self) -> str:
        return f"{self.runtime}@{self.version}"

    def packages(self) -> list[str]:
        pins = [f"{self.package}=={self.version}", *RUNTIMES[self.runtime].extra_packages]
        since = NUMPY2_SINCE.get(self.package)
        pins.append("numpy<2" if since is not None and Version(self.version) < since else "numpy")
        return [*pins, "onnx"]

    def spec(self, python: str = "3.11", install: Any = None) -> EnvSpec:
        """Its environment; ``install``: the matrix's ``install`` (indexes, find-links)."""
        spec = EnvSpec(name="", torch="", python=python, family="runtime-only",
                       packages=self.packages(), runtimes=[self.runtime],
                       find_links=list(getattr(install, "find_links", None) or []),
                       index_url=getattr(install, "index_url", None),
                       extra_index_urls=list(getattr(install, "extra_index_urls", None) or []))
        spec.name = f"runtime-only-{self.runtime}{self.version}-{spec.spec_hash[:8]}"
        return spec


@dataclass
class RuntimeOnlyEnv:
    """A realised runtime-only environment, or why it could not be made."""

    release: RuntimeRelease
    python: str = ""            # its interpreter
    marker: EnvMarker | None = None
    error: str | None = None    # the install's own message (a release the index lacks, no wheel)


class RuntimeOnlyEnvs:
    """Builds (once) and hands out runtime-only environments."""

    def __init__(self, provider: VenvProvider | None = None, python: str = "3.11", install: Any = None) -> None:
        self.provider = provider or VenvProvider(log=lambda *a: None)
        self.python, self.install = python, install
        self._made: dict[RuntimeRelease, RuntimeOnlyEnv] = {}

    def get(self, release: RuntimeRelease) -> RuntimeOnlyEnv:
        if release not in self._made:
            spec = release.spec(self.python, self.install)
            try:
                marker = self.provider.ensure(spec)
                self._made[release] = RuntimeOnlyEnv(release, str(self.provider.python(spec)), marker)
            except EnvironmentBuildError as exc:
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                self._made[release] = RuntimeOnlyEnv(release, error=" ".join(lines[-3:])[:400])
        return self._made[release]
