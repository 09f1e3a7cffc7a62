"""The tool's one console (rich, on stderr) and its message helpers: every subcommand and the
progress display write through these, so output goes to one place in one style."""
from __future__ import annotations

import sys

from harness.console import console

__all__ = ["console", "error", "result", "say"]


def say(message: str) -> None:
    """A line for the person at the terminal (stderr): progress, where the reports are."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def error(message: str) -> None:
    """One line on stderr: ``error: ...``."""
    print(f"error: {message}", file=sys.stderr)


def result(message: str = "") -> None:
    """What the command answers (stdout): a plan, a path, a verdict; what scripts read."""
    print(message)
