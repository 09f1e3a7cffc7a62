"""Where things are: the project checkout, the harness package, the default store and environments.

Computed once here; every other module imports these names. Two ways to run:

- **from a checkout** (this repository, also installed editable): the defaults are the
  checkout's own `matrix.yaml`, `reports/` and `.envs/`, wherever the command is started;
- **installed** (`pip install` / `uv tool install`, the package in a site-packages folder): the
  matrix file and the store are the current directory's (`./matrix.yaml`, `./reports`), and the
  environments live in the user cache directory, shared by every repository on the machine
  (`$XDG_CACHE_HOME/torch-onnx-matrix/envs`, by default `~/.cache/torch-onnx-matrix/envs`).

`HARNESS_ENVS_DIR` overrides the environments folder in both. Inside a Docker image the harness
is a copy under /opt/harness, so the "project root" there is its parent folder.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parent.parent
# The code a result depends on, hashed into every cell's cache key (``harness.store.provenance``)
# and never counted among a case's own files (``harness.worker.loaded``): the worker, the runner,
# the runtimes and the types they share.
RESULT_CODE_DIRS = ("core", "run", "runtimes", "worker")
PROJECT_ROOT = HARNESS_DIR.parent
# Installed as a package (not a checkout, not an image's copy): defaults follow the current directory.
INSTALLED = PROJECT_ROOT.name in ("site-packages", "dist-packages")
WORKSPACE = Path.cwd() if INSTALLED else PROJECT_ROOT
DEFAULT_CONFIG = WORKSPACE / "matrix.yaml"
REPORTS = WORKSPACE / "reports"
IMAGES = PROJECT_ROOT / "images"
APP_NAME = "torch-onnx-matrix"


def user_cache_dir() -> Path:
    """The tool's folder in the user cache directory (XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / APP_NAME


def envs_dir() -> Path:
    """Where uv environments (and Docker markers) live: HARNESS_ENVS_DIR, else .envs/ in the
    checkout, else (installed) the user cache directory."""
    if os.environ.get("HARNESS_ENVS_DIR"):
        return Path(os.environ["HARNESS_ENVS_DIR"])
    return user_cache_dir() / "envs" if INSTALLED else PROJECT_ROOT / ".envs"


def import_root() -> Path:
    """A folder to put on a worker's PYTHONPATH so that it imports this harness and nothing else.

    A checkout (or an image's copy) is that folder already. An installed package sits among the
    tool's own dependencies (pandas, numpy, ... of other versions than an environment's), so the
    folder is one in the user cache holding only a link to the installed package."""
    here = Path(os.path.abspath(__file__)).parents[2]   # not resolved: a link's folder stays itself
    if here.name not in ("site-packages", "dist-packages"):
        return here
    folder = user_cache_dir() / "pythonpath" / hashlib.sha256(str(HARNESS_DIR).encode()).hexdigest()[:12]
    link = folder / "harness"
    if not (link.is_symlink() and link.resolve() == HARNESS_DIR):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".harness-{os.getpid()}"
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(HARNESS_DIR, target_is_directory=True)
        os.replace(tmp, link)
    return folder
