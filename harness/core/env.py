"""An environment: what one stack installs (``EnvSpec``, from the plan) and what a provider
reports once it is realised (``EnvMarker``, kept in run.json per environment)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any


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
