"""Options shared by several subcommands, each declared once here; a subcommand's own options
take their defaults from its request type (``MatrixRequest``, ``GateRequest``, ...).

Nothing heavy is imported here: building the parser for ``--help`` must stay cheap.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from harness.envs.provider import PROVIDERS
from harness.matrix.rules import ConfigError

__all__ = ["PROVIDERS", "ConfigError", "config", "default_of", "positive_int", "share", "shard", "store", "workspace"]

# Where the default matrix file and store are: the checkout for `python -m harness` there, the
# current directory for the installed command (set by harness.cli.build_parser).
_WORKSPACE: list[Path] = []


def workspace() -> Path:
    from harness.core.paths import DEFAULT_CONFIG

    return _WORKSPACE[0] if _WORKSPACE else DEFAULT_CONFIG.parent


def default_of(request: type, name: str) -> Any:
    """The default of field ``name`` of a request dataclass: the one place it is declared."""
    f = {f.name: f for f in dataclasses.fields(request)}[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def share(text: str) -> float:
    """A share given as 0.9 or 90% (its range is checked with the settings it belongs to)."""
    raw = text.strip()
    try:
        return float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 0.9 or 90% (got {text!r})") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 (got {text!r})")
    return value


def config(p: argparse.ArgumentParser, default: Path | None = None, only: bool = True,
           label: str | None = None) -> None:
    default = default or workspace() / "matrix.yaml"
    p.add_argument("--config", type=Path, default=default, help=f"matrix file (default: {label or default.name})")
    if only:
        p.add_argument("--only", default=None,
                       help="filter cells, e.g. torch=2.13.0,exporter=dynamo|torchscript")


def shard(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="only shard K of N: environment-affine, balanced by previous durations")
    p.add_argument("--durations", default="auto",
                   help="what shards are balanced by: auto (newest finished runs in the store), none "
                        "(cell count), a run, or a JSON file (plan --format json); every shard of a "
                        "split needs the same")
    p.add_argument("--torch", default=None, metavar="V,V",
                   help="exactly these torch releases, as the gate plans them (unlisted ones get "
                        "default companion pins)")


def store(p: argparse.ArgumentParser) -> None:
    # Also accepted after the subcommand, where `nox -s report -- ...` puts it.
    p.add_argument("--reports", type=Path, default=argparse.SUPPRESS, help="results store (default: reports/)")


def verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print every finished cell, skips included (default: failures only, then a summary)")
