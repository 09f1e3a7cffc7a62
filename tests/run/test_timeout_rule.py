"""The timeout rule (``Progress``): a cell is judged by its own progress, the CPU time its
processes got, not by wall time alone; a hung one still ends at cell_timeout_s."""
from __future__ import annotations

import pytest

from harness.core.status import Status
from harness.run.timeouts import TIMEOUT_WALL_FACTOR, Progress


class Tree:
    """A cell's process tree on a fake clock, getting ``share`` of one CPU."""

    def __init__(self, share: float) -> None:
        self.now, self.cpu, self.share = 0.0, 0.0, share

    def clock(self) -> float:
        return self.now

    def measure(self) -> float:
        return self.cpu

    def run_until_timeout(self, progress: Progress, limit_s: float = 10_000):
        while self.now < limit_s:
            self.now += 0.25
            self.cpu += 0.25 * self.share
            death = progress.poll()
            if death is not None:
                return death
        raise AssertionError("never timed out")


def test_a_hung_cell_ends_at_cell_timeout_s_of_wall_time():
    tree = Tree(share=0.0)
    death = tree.run_until_timeout(Progress(60, tree.measure, tree.clock))
    assert death.status is Status.TIMEOUT and death.final
    assert 60 <= death.wall_s <= 61 and death.cpu_s == 0
    assert "idle" in death.why


def test_a_busy_cell_on_an_idle_machine_ends_at_cell_timeout_s():
    tree = Tree(share=1.0)
    death = tree.run_until_timeout(Progress(60, tree.measure, tree.clock))
    assert 60 <= death.wall_s <= 62 and death.cpu_s >= 60 and "CPU time" in death.why


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_a_starved_cell_gets_its_budget_in_cpu_seconds(share):
    tree = Tree(share=share)
    death = tree.run_until_timeout(Progress(60, tree.measure, tree.clock))
    assert death.wall_s >= 60 / share - 2 and 60 <= death.cpu_s <= 62


def test_no_cell_runs_past_the_wall_ceiling():
    tree = Tree(share=0.1)      # busy enough not to look hung, too slow to spend its budget
    death = tree.run_until_timeout(Progress(60, tree.measure, tree.clock))
    assert death.wall_s == pytest.approx(60 * TIMEOUT_WALL_FACTOR, abs=1) and death.cpu_s < 60


def test_progress_restarts_the_budget_and_the_first_one_covers_imports():
    tree = Tree(share=0.0)
    progress = Progress(60, tree.measure, tree.clock)
    progress.reset(extra_s=120)
    death = tree.run_until_timeout(progress)
    assert 180 <= death.wall_s <= 181
    tree.now += 1000
    progress.reset()
    assert progress.poll() is None
    assert 60 <= tree.run_until_timeout(progress).wall_s <= 61


def test_an_unmeasured_tree_is_judged_by_wall_time():
    tree = Tree(share=1.0)
    death = tree.run_until_timeout(Progress(60, None, tree.clock))
    assert 60 <= death.wall_s <= 61 and death.cpu_s is None
