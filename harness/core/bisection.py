"""One bisection for every search over ordered releases: torch bisect and package bisect
(``harness.gate.bisect``) and the runtime floors (``harness.run.post.runtime_floors``).

A generator, so that a caller can run many searches side by side (the floors ask one process per
release for every file at once): it yields the index to judge next and is sent which side that
index is on. Standard library only.
"""
from __future__ import annotations

from typing import Callable, Generator, Literal

Search = Generator[int, "bool | None", tuple[int, int, set[int]]]


def bisection(lo: int, hi: int, middle: Literal["lower", "upper"] = "lower") -> Search:
    """Narrow ``lo < hi`` (``lo`` known on the old side, ``hi`` on the new; ``lo`` may be -1, a
    virtual index below the first) to adjacent indices. Yields each index to judge and is sent
    True (the old side), False (the new side) or None (it cannot be judged: stepped over, as
    ``git bisect skip`` does). Returns ``(lo, hi, skipped)``; ``hi - lo > 1`` when only skipped
    indices were left between them. ``middle``: of an even count of candidates, the lower or the
    upper of the two in the middle."""
    skipped: set[int] = set()
    while hi - lo > 1:
        candidates = [i for i in range(lo + 1, hi) if i not in skipped]
        if not candidates:
            break
        if middle == "lower":
            mid = min(candidates, key=lambda i: (abs(i - (lo + hi) / 2), i))
        else:
            mid = candidates[len(candidates) // 2]
        side = yield mid
        if side is None:
            skipped.add(mid)
        elif side:
            lo = mid
        else:
            hi = mid
    return lo, hi, skipped


def run_search(search: Search, old_side: Callable[[int], "bool | None"]) -> tuple[int, int, set[int]]:
    """Drive one bisection with a judge of one index at a time."""
    try:
        index = next(search)
        while True:
            index = search.send(old_side(index))
    except StopIteration as stop:
        return stop.value
