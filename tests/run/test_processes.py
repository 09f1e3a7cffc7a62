"""harness/run/processes.py: the memory rule's reading of a worker's tree. The PSS sum (what the
rule judges) is read only when the cheap RSS sum, never below it, is over the limit."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.run.processes import tree_rss

MIB = 1 << 20


@pytest.fixture
def tree():
    """A process holding 64 MiB of its own, with a child of its own, both idle."""
    code = ("import subprocess, sys, time\n"
            "block = bytearray(64 << 20)\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)     # the child's interpreter is up
    yield proc
    import psutil

    for p in psutil.Process(proc.pid).children(recursive=True):
        p.kill()
    proc.kill()
    proc.wait()


def test_the_rss_bound_stands_in_for_the_pss_only_when_within_the_limit(tree):
    pss = tree_rss(tree.pid)                       # no limit: the proportional sum
    under = tree_rss(tree.pid, limit=1 << 40)      # the bound is within: the bound itself
    over = tree_rss(tree.pid, limit=1)             # the bound is over: the proportional sum again
    assert pss > 64 * MIB                          # the parent's block and both interpreters
    assert under >= pss                            # each process's RSS counts its shared pages whole
    assert over <= under and over == pytest.approx(pss, rel=0.05)
    assert under > pss * 1.01                      # two Pythons share their libraries: PSS is smaller


def test_a_gone_tree_reads_zero():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert tree_rss(proc.pid) == 0 and tree_rss(proc.pid, limit=1) == 0
