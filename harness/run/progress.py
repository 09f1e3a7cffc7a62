"""A run's progress output: the bar (with its estimate of the time left) and a line per finished
cell. On a terminal only failures get a line (the bar counts the rest); elsewhere (CI logs)
every cell but skips; ``verbose``: every cell."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness.console import console as tool_console
from harness.core.record import Record
from harness.core.status import Status


class RunProgress:
    """Used as a context manager around the run: the bar is shown while it is open."""

    def __init__(self, total: int, verbose: bool = False, console: Console | None = None) -> None:
        self.console = console or tool_console
        quiet = {Status.SKIP} if not verbose else set()
        if not verbose and self.console.is_terminal:
            quiet |= {Status.PASS, Status.XFAIL}
        self.quiet = quiet
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                            console=self.console, transient=False, disable=not self.console.is_terminal)
        self.task = self.bar.add_task("cells", total=total)

    def __enter__(self) -> "RunProgress":
        self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.stop()

    def describe(self, text: str) -> None:
        """What the bar says the run is on (a cell id, an environment's latency phase)."""
        self.bar.update(self.task, description=text)

    def finished(self, records: list[Record], cached: bool = False) -> None:
        """Cells recorded: a line each (cached cells are summed up per environment instead)."""
        for rec in records:
            if not cached and rec.status not in self.quiet:
                mark = {Status.PASS: "[green]pass[/]", Status.SKIP: "[dim]skip[/]"}.get(rec.status, f"[red]{rec.status}[/]")
                self.console.print(f"  {mark} {escape(rec.cell_id)}"
                                   + (f"  ({rec.stage}: {escape(rec.error)})" if rec.error else ""))
        self.bar.advance(self.task, len(records))
