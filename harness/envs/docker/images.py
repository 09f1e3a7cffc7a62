"""Image recipes: which Dockerfile hosts an environment, its build arguments and content tag.

An image is tagged with a hash of everything that decides its content: the Dockerfile and the
scripts it runs, the build arguments (base, Python, every package pin), the local wheels it may
install from, the index settings and the harness source. An existing tag is never rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.paths import HARNESS_DIR, IMAGES
from harness.envs.provider import EnvironmentBuildError
from harness.matrix.config import COMPANIONS
from harness.runtimes import runtime_info

if TYPE_CHECKING:
    from harness.core.env import EnvSpec

REPOSITORY = "torch-onnx-matrix"


@dataclass(frozen=True)
class Recipe:
    name: str           # also the Dockerfile's stem under images/
    default_base: str   # the public base the Dockerfile names; LOCAL_BASE replaces it offline
    gpu: bool


RECIPES = {r.name: r for r in (
    Recipe("ort-cpu", "python:3.11-slim", gpu=False),
    Recipe("ort-cuda", "nvidia/cuda:13.0.1-cudnn-runtime-ubuntu22.04", gpu=True),
    Recipe("tensorrt", "nvcr.io/nvidia/tensorrt:24.12-py3", gpu=True),
    Recipe("openvino", "openvino/ubuntu22_runtime:2025.3.0", gpu=False),
    Recipe("ort-openvino", "python:3.11-slim", gpu=False),
    Recipe("node", "python:3.11-slim", gpu=False),   # ort-node / ort-web: Node.js + npm packages
)}
# A family shared by several runtimes uses the first recipe that hosts all of them; the pip
# wheels carry each runtime, so the base only adds system libraries (CUDA, OpenVINO's plugins).
FAMILY_DEFAULT = {"cpu": "ort-cpu", "gpu": "ort-cuda", "node": "node", "ort-openvino": "ort-openvino"}


def recipe_for(spec: "EnvSpec") -> Recipe:
    names = {label.split("@", 1)[0] for label in spec.runtimes}
    if len(names) == 1 and (only := next(iter(names))) in RECIPES:
        return RECIPES[only]
    if spec.family in FAMILY_DEFAULT:
        return RECIPES[FAMILY_DEFAULT[spec.family]]
    raise KeyError(f"no image recipe for runtime family {spec.family!r} "
                   f"(runtimes {sorted(names)}); known: {', '.join(RECIPES)}")


def dockerfile(recipe: Recipe) -> Path:
    return IMAGES / f"{recipe.name}.Dockerfile"


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def build_args(spec: "EnvSpec", base_image: str) -> dict[str, str]:
    """Build arguments from the spec's package list, split into the groups the Dockerfiles name."""
    runtime_dists = set()
    for label in spec.runtimes:
        info = runtime_info(label.split("@", 1)[0])
        runtime_dists |= {info.package, *map(_dist, info.extra_packages)}
    groups: dict[str, list[str]] = {"COMPANION_PACKAGES": [], "RUNTIME_PACKAGES": [],
                                    "EXTRA_PACKAGES": []}
    for req in spec.packages:
        dist = _dist(req)
        if dist == "torch":
            continue
        key = ("COMPANION_PACKAGES" if dist in COMPANIONS else
               "RUNTIME_PACKAGES" if dist in runtime_dists else "EXTRA_PACKAGES")
        groups[key].append(req)
    return {"BASE_IMAGE": base_image, "PYTHON": spec.python, "TORCH_VERSION": spec.torch,
            **{k: " ".join(v) for k, v in groups.items()}, "HARNESS_HASH": harness_hash()}


def tree_hash(root: Path, patterns: tuple[str, ...] = ("*",)) -> str:
    h = hashlib.sha256()
    files = sorted({p for pat in patterns for p in root.rglob(pat) if p.is_file()
                    and "__pycache__" not in p.parts and p.suffix != ".pyc"})
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def harness_hash() -> str:
    """The harness version baked into images: a hash of its source (code changes, tags change)."""
    return tree_hash(HARNESS_DIR)


def local_wheels(spec: "EnvSpec") -> list[Path]:
    """Wheels in the spec's find-links folders for packages it installs (others would only
    invalidate the install layer's cache)."""
    wanted = {_dist(r).replace("-", "_") for r in spec.packages}
    dirs = list(spec.find_links)
    dirs += [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if d not in dirs]
    found: list[Path] = []
    for d in dirs:
        folder = Path(d.removeprefix("file://"))
        if folder.is_dir():
            found += [w for w in sorted(folder.glob("*.whl"))
                      if w.name.split("-", 1)[0].lower() in wanted]
    return found


def index_settings(spec: "EnvSpec") -> dict[str, list[str]]:
    """Package-index URLs for uv inside the build: the matrix's, else the host's environment.

    file:// indexes are left out: they are folders of this machine, not reachable in a build.
    """
    index = spec.index_url or os.environ.get("UV_INDEX_URL") or os.environ.get("UV_DEFAULT_INDEX") \
        or os.environ.get("PIP_INDEX_URL")
    extra = list(spec.extra_index_urls)
    for var in ("UV_EXTRA_INDEX_URL", "UV_INDEX", "PIP_EXTRA_INDEX_URL"):
        extra += [u for u in os.environ.get(var, "").split() if u not in extra]
    remote = [u for u in ([index] if index else []) + extra if not u.startswith("file:")]
    return {"UV_INDEX_URL": [u for u in remote if u == index],
            "UV_EXTRA_INDEX_URL": [u for u in remote if u != index]}


def index_env(settings: dict[str, list[str]]) -> str:
    """The index settings as a shell file the build sources (handed in as a BuildKit secret:
    URLs may carry credentials)."""
    return "".join(f"export {k}={shlex.quote(' '.join(v))}\n" for k, v in settings.items() if v)


def uv_binary() -> Path:
    """The uv executable itself (PATH may hold a wrapper script), bind-mounted into builds."""
    try:
        import uv

        path = Path(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        from harness.envs.provider import uv_bin

        path = Path(uv_bin()).resolve()
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise EnvironmentBuildError(f"{path} is not the uv executable (a wrapper?); pip install uv")
    return path


def uv_version(path: Path) -> str:
    return subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout.strip()


def image_tag(recipe: Recipe, args: dict[str, str], wheels: list[Path],
              settings: dict[str, list[str]]) -> str:
    blob = json.dumps({
        "dockerfile": dockerfile(recipe).read_text(),
        "scripts": tree_hash(IMAGES / "scripts"),
        "args": args,
        "wheels": [(w.name, w.stat().st_size) for w in wheels],
        "index": hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(),
        "uv": uv_version(uv_binary()),  # the installer resolves: another uv, maybe other pins
    }, sort_keys=True)
    return f"{REPOSITORY}/{recipe.name}:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
