"""Where things are: the project checkout, the harness package, the default store and environments.

Computed once here; every other module imports these names. Inside a Docker image the harness
is a copy under /opt/harness, so the "project root" there is its parent folder.
"""
from __future__ import annotations

import os
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parent.parent
PROJECT_ROOT = HARNESS_DIR.parent
DEFAULT_CONFIG = PROJECT_ROOT / "matrix.yaml"
REPORTS = PROJECT_ROOT / "reports"
IMAGES = PROJECT_ROOT / "images"


def envs_dir() -> Path:
    """Where uv environments (and Docker markers) live: HARNESS_ENVS_DIR, else .envs/ in the checkout."""
    return Path(os.environ.get("HARNESS_ENVS_DIR", PROJECT_ROOT / ".envs"))
