"""Rules over a cell's axes (include, exclude, xfail, --only): asv-style dict matching."""
from __future__ import annotations

import re
from typing import Any

from harness.core.cell import AXES


class ConfigError(ValueError):
    """A matrix file or argument that cannot be used; the message names file, key and expectation."""


def matches(rule: dict[str, Any], axes: dict[str, Any]) -> bool:
    """Every key in the rule must match; lists mean any-of; '~regex' matches a pattern."""
    for key, want in rule.items():
        values = want if isinstance(want, list) else [want]
        if str(axes.get(key)) not in {str(v) for v in values} and not any(
            isinstance(v, str) and v.startswith("~") and re.fullmatch(v[1:], str(axes.get(key)))
            for v in values
        ):
            return False
    return True


def parse_only(expr: str | None) -> dict[str, list[str]]:
    """'torch=2.13.0,exporter=dynamo|torchscript' → {'torch': ['2.13.0'], 'exporter': [...]}."""
    rule: dict[str, list[str]] = {}
    for part in filter(None, (expr or "").split(",")):
        if "=" not in part:
            raise ConfigError(f"--only: expected AXIS=VALUE pairs separated by commas, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in AXES:
            raise ConfigError(f"--only: unknown axis {key!r}; expected one of {list(AXES)}")
        for v in value.split("|"):
            if v.startswith("~"):
                try:
                    re.compile(v[1:])
                except re.error as exc:
                    raise ConfigError(f"--only: {key}={v!r} is not a valid regular expression ({exc})") from None
            rule.setdefault(key, []).append(v)
    return rule
