"""An environment's work queue: its export groups still to run, shared by every slot that runs
them (``EnvWork``), in the order they are handed out (``group_order``)."""
from __future__ import annotations

import os
import random
import threading
from collections import deque
from typing import Iterable

from harness.core.job import ExportGroup
from harness.matrix.plan import EnvPlan

GROUP_ORDER_ENV = "HARNESS_GROUP_ORDER"   # tests: "reverse" or "shuffle:SEED" (plan order if unset)


def group_order(groups: Iterable[ExportGroup]) -> list[ExportGroup]:
    """The order an environment's groups are handed out in: the plan's, or, to show that no
    verdict depends on it, reversed or shuffled (``HARNESS_GROUP_ORDER``)."""
    out = list(groups)
    order = os.environ.get(GROUP_ORDER_ENV, "")
    if order == "reverse":
        out.reverse()
    elif order.startswith("shuffle:"):
        random.Random(order.split(":", 1)[1]).shuffle(out)
    return out


class EnvWork:
    """An environment's export groups still to run, shared by every supervisor (slot) that runs
    them, and each cell's worker deaths (a cell retried by another slot keeps its count)."""

    def __init__(self, env_plan: EnvPlan, groups: Iterable[ExportGroup] = ()) -> None:
        self.env_plan = env_plan
        self.queue: deque[ExportGroup] = deque(group_order(groups))
        self.deaths: dict[str, list[str]] = {}
        self.early_ends = 0           # workers of this environment that ended early
        self.startup_deaths = 0       # workers killed before their first group, in a row
        self.failed: Exception | None = None
        self.lock = threading.RLock()

    def take(self) -> ExportGroup | None:
        with self.lock:
            return self.queue.popleft() if self.queue and self.failed is None else None

    def take_family(self) -> list[ExportGroup]:
        """The next group and every queued group of its family (the same case, exporter and
        options at other opsets: ``ExportGroup.capture_key``), which one worker runs from one
        capture (``harness.worker.capture_reuse``); [] when none is left."""
        with self.lock:
            if not self.queue or self.failed is not None:
                return []
            first = self.queue.popleft()
            key = first.capture_key()
            family = [first, *(g for g in self.queue if g.capture_key() == key)]
            if len(family) > 1:
                self.queue = deque(g for g in self.queue if g.capture_key() != key)
            return family

    def take_all(self) -> list[ExportGroup]:
        with self.lock:
            out, self.queue = (list(self.queue), deque()) if self.failed is None else ([], self.queue)
            return out

    def give_back(self, groups: list[ExportGroup]) -> None:
        """Unfinished groups go first: the next free worker retries them."""
        with self.lock:
            self.queue.extendleft(reversed(groups))

    def drain(self) -> list[ExportGroup]:
        with self.lock:
            out, self.queue = list(self.queue), deque()
            return out

    def __len__(self) -> int:
        with self.lock:
            return len(self.queue)
