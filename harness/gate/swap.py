"""Which change flipped a bisected verdict: torch, or a companion pin that moved with it.

Two adjacent torch releases' environments may also differ in onnxscript, onnx, numpy or protobuf
pins. At the boundary the newer torch is tried again with the older release's pins (all of them,
then one at a time): a verdict that comes back to the older one names the pin; one that stays
names torch.
"""
from __future__ import annotations

from typing import Callable

from harness.matrix.config import COMPANIONS, Matrix
from harness.matrix.environments import env_spec_for


def env_pins(matrix: Matrix, version: str) -> dict[str, str]:
    """Package → pinned version of the environment a torch release gets from this matrix."""
    env = env_spec_for(matrix.torch_entry(version, existing=False), matrix.runtimes[0], matrix)
    return dict(p.split("==", 1) for p in env.packages if "==" in p and not p.startswith("torch=="))


def with_pins(matrix: Matrix, version: str, pins: dict[str, str]) -> Matrix:
    """The matrix holding only torch ``version``, with these companions pinned."""
    return matrix.one_release(version, **pins)


def which_change(matrix: Matrix, older: str, newer: str, verdicts: dict[str, str | None],
                 verdict_with: Callable[[Matrix, str], str | None]) -> str | None:
    """One line saying what flipped the verdict between ``older`` and ``newer``; None when their
    environments differ in torch only. ``verdict_with(matrix, label)``: the cell's verdict on the
    matrix's one torch entry (``label`` names that variant for the run cache and messages)."""
    a, b = env_pins(matrix, older), env_pins(matrix, newer)
    changed = [n for n in COMPANIONS if a.get(n) and a.get(n) != b.get(n)]
    if not changed:
        return None
    before = verdicts[older]
    moves = ", ".join(f"{n} {a[n]} → {b.get(n, '—')}" for n in changed)   # what moved with torch
    swapped = verdict_with(with_pins(matrix, newer, {n: a[n] for n in changed}), f"{newer} with {older}'s pins")
    if swapped is None:
        return (f"cannot tell which change flipped it: torch {newer} with {older}'s pins ({moves}) "
                "could not be tested")
    if swapped != before:
        return (f"the change that flipped it: torch {older} → {newer} (torch {newer} with {older}'s "
                f"pins, {moves}, is still {swapped})")
    for name in changed if len(changed) > 1 else []:
        one = verdict_with(with_pins(matrix, newer, {name: a[name]}), f"{newer} with {name} {a[name]}")
        if one == before:
            return (f"the change that flipped it: {name} {a[name]} → {b.get(name, '—')} (torch {newer} "
                    f"with {name} {a[name]} is {one} again)")
    if len(changed) == 1:
        name = changed[0]
        return (f"the change that flipped it: {name} {a[name]} → {b.get(name, '—')} (torch {newer} "
                f"with {name} {a[name]} is {swapped} again)")
    return f"the change that flipped it: the companion pins together ({moves} gives {swapped} again)"
