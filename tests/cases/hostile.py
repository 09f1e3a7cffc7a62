"""Cases that attack the runner itself: they end, fork, flood or hog the worker process, or
give it text and values it must take as data (lone surrogates, a model that is not one).

Each healthy-looking one returns the same tiny model, so that a cell that survives the attack
passes. ``HOSTILE_PID_DIR`` (inherited from the runner's environment) is where the forking
cases leave the pids of the processes they leave behind, for the test to check they are gone.
"""
from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn


def _model():
    torch.manual_seed(0)
    return nn.Linear(4, 2).eval(), (torch.randn(2, 4),)


def _note_pid(name: str) -> None:
    folder = os.environ.get("HOSTILE_PID_DIR")
    if folder:
        with open(os.path.join(folder, f"{name}.pid"), "w") as fh:
            fh.write(str(os.getpid()))


def exits_zero():
    """Ends the worker with exit status 0 in the middle of a cell."""
    sys.exit(0)


def os_exit_zero():
    """Ends the worker at once, exit status 0, no cleanup."""
    os._exit(0)


def forks():
    """Forks; the child returns into the worker loop like the parent (a copy of the worker)."""
    if os.fork() == 0:
        _note_pid("forks-child")
    return _model()


def forks_and_holds():
    """A daemon: double fork and setsid, so that it leaves the worker's process tree and group,
    and sleeps holding the worker's pipes (events, stdout); the worker goes on."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            _note_pid("daemon")
            time.sleep(3600)
        os._exit(0)
    return _model()


def floods():
    """200 MiB on stdout (C level), then fails: its log and its bundle must stay small."""
    line = b"x" * 1023 + b"\n"
    block = line * 1024
    for _ in range(200):
        os.write(1, block)
    raise RuntimeError("failed after flooding stdout")


def hogs():
    """Takes memory until 6 GiB, then waits: without a memory limit this is a timeout."""
    held = []
    for _ in range(6 * 16):
        held.append(b"\x01" * (64 << 20))   # written, hence resident
        time.sleep(0.02)
    time.sleep(3600)


def slow():
    """Sleeps HOSTILE_SLOW_S seconds (default 60) before returning the model."""
    time.sleep(float(os.environ.get("HOSTILE_SLOW_S", "60")))
    return _model()


# A file name that is not UTF-8, as os.fsdecode gives it: lone surrogates U+DCFF, U+DCFE.
UNDECODABLE = os.fsdecode(b"weights-\xff\xfe.bin")


def tiny():
    """A healthy case."""
    return _model()


def surrogate_error():
    """Fails at the reference stage with an error text holding lone surrogates."""
    raise FileNotFoundError(f"cannot open {UNDECODABLE}")


class _FailsWhenTraced(nn.Module):
    def forward(self, x):
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            raise ValueError(f"cannot trace {UNDECODABLE}")
        return x + 1


def surrogate_at_export():
    """Runs in eager, fails at export with an error text holding lone surrogates."""
    return _FailsWhenTraced().eval(), (torch.randn(2, 4),)


def not_a_module():
    """Returns a string where the model goes."""
    return "a model", (torch.randn(2, 4),)


def a_class():
    """Returns the model's class instead of a model."""
    return nn.Linear, (torch.randn(2, 4),)
