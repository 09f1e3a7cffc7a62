"""First diverging node (filled in below)."""
from __future__ import annotations

from typing import Any


def first_divergence(ctx: Any, rec: Any) -> dict[str, Any] | None:
    return None
