"""The runner's signal handling: SIGTERM, SIGINT and SIGHUP end the run resumable."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

INTERRUPTS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM, SIGINT or SIGHUP reached the runner: its workers (and their process trees) are
    ended and the run stays unfinished, to be resumed. The CLI exits with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the block runs, the first SIGTERM/SIGINT/SIGHUP raises ``RunInterrupted`` in the main
    thread (so every ``finally`` on the way out ends its worker); later ones wait for that."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in INTERRUPTS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
