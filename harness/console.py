"""The tool's one console: rich, on stderr, no syntax highlighting of numbers and paths. Every
runner-side module (the run core, the gate, bisect, the pipeline, the CLI) prints through it, so
progress bars and messages share one terminal and one style; what a command answers (a plan, a
verdict) goes to stdout with ``print``. Runner side only: the worker never imports rich."""
from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, highlight=False)
