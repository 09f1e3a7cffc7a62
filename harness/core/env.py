"""An environment: what one stack installs (``EnvSpec``, from the plan) and what a provider
reports once it is realised (``EnvMarker``, kept in run.json per environment); an environment
used as it is (``ExistingEnv``: an interpreter or a local image, and what was found there)."""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ExistingEnv:
    """An environment the matrix uses as it is (``torch: [{python: PATH}]`` or ``[{image: NAME}]``):
    where it is, and what a probe found installed there (``harness.envs.existing``). Nothing is
    ever installed, upgraded or written inside it.

    ``identity`` is what its cells ran on: the installed set (names, versions, and each
    distribution's file hashes where its RECORD lists them), the Python, the platform and, for an
    image, the image's id. An environment changed in place gets another identity (its cells run
    again); two paths to the same installed set share one (their results are reused)."""

    python: str                     # the interpreter: a path here, or inside the image
    image: str | None               # a local Docker image; None: an interpreter on this machine
    key: str                        # what named it: "torch[1]", "--candidate-env"
    torch: str                      # torch.__version__ as found, e.g. "2.13.0+cpu"
    python_version: str             # e.g. "3.11.9"
    installed: tuple[str, ...]      # "name==version" (canonical names), sorted
    hashes: dict[str, str] = field(default_factory=dict)   # name → digest of its files
    modules: tuple[str, ...] = ()   # runtime modules importable there (onnxruntime, openvino...)
    facts: dict[str, Any] = field(default_factory=dict)    # cuda, executable, prefix, image_id...

    @property
    def release(self) -> str:
        """The torch release (the cells' ``torch``): the version without its build label."""
        return self.torch.split("+", 1)[0]

    @property
    def where(self) -> str:
        return f"image {self.image} ({self.python})" if self.image else self.python

    @property
    def versions(self) -> dict[str, str]:
        return dict(line.split("==", 1) for line in self.installed if "==" in line)

    @functools.cached_property
    def identity(self) -> str:
        lines = [f"{line} {self.hashes.get(line.split('==', 1)[0], '')}" for line in self.installed]
        blob = json.dumps({"python": self.python_version, "platform": self.facts.get("platform"),
                           "image_id": self.facts.get("image_id"), "installed": sorted(lines)},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"python": self.python, "image": self.image, "key": self.key, "torch": self.torch,
                "python_version": self.python_version, "identity": self.identity,
                "modules": list(self.modules), **self.facts}


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
    existing: ExistingEnv | None = None   # used as it is: nothing is installed
    absent: dict[str, str] = field(default_factory=dict)   # runtime label → why it cannot run there

    @property
    def spec_hash(self) -> str:
        if self.existing is not None:
            return self.existing.identity[:12]
        blob = json.dumps({"python": self.python, "packages": sorted(self.packages),
                           "find_links": self.find_links, "index_url": self.index_url,
                           "extra": self.extra_index_urls}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def index_args(self) -> list[str]:
        """uv's index flags for this environment: the install and its up-front resolution use
        the same ones, so a resolution says what the install will find."""
        args: list[str] = []
        for link in self.find_links:
            args += ["--find-links", link]
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        return args

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "torch": self.torch, "python": self.python, "family": self.family,
                "packages": self.packages, "runtimes": self.runtimes, "spec_hash": self.spec_hash}


@dataclass
class EnvMarker:
    """A realised environment: its spec summary, the exact installed package set and timings."""

    name: str
    torch: str
    python: str
    family: str
    packages: list[str]
    runtimes: list[str]
    spec_hash: str
    installed: list[str] = field(default_factory=list)
    install_s: float | None = None
    reused: bool = False
    provider: str = "venv"
    extra: dict[str, Any] = field(default_factory=dict)  # provider facts (image, image_id, base_image…)

    @classmethod
    def for_spec(cls, spec: EnvSpec, **kw: Any) -> "EnvMarker":
        return cls(**spec.to_dict(), **kw)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EnvMarker":
        names = {f.name for f in fields(cls)} - {"extra"}
        extra = {**data.get("extra", {}), **{k: v for k, v in data.items() if k not in names | {"extra"}}}
        return cls(**{k: v for k, v in data.items() if k in names}, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra"}
        return {**out, **self.extra}

    @property
    def lock_hash(self) -> str:
        """Hash of the exact installed package set (not the request): what a cell ran on."""
        return hashlib.sha256("\n".join(sorted(self.installed)).encode()).hexdigest()[:16]

    @property
    def identity(self) -> str:
        """What a cell ran on, for the cell cache: an existing environment's identity (its
        installed set with the files' hashes, ``ExistingEnv.identity``), else the lock hash."""
        return str(self.extra.get("identity") or self.lock_hash)
