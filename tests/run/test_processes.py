"""harness/run/processes.py: the memory rule's reading of a worker's tree (the PSS sum, what the
rule judges, is read only when the cheap RSS sum, never below it, is over the limit) and the
clean-up (``reap``: the processes carrying a worker's token, read among those started after it)."""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from harness.core.wire import TOKEN_ENV
from harness.run.processes import reap, tree_rss

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


def _daemon(token: str) -> int:
    """A process carrying ``token`` that left its parent's tree and session (double fork,
    setsid), as a case's daemon does; returns its pid."""
    code = ("import os, sys, time\n"
            "if os.fork():\n    os._exit(0)\n"
            "os.setsid()\n"
            "if os.fork():\n    os._exit(0)\n"
            "print(os.getpid(), flush=True)\n"
            "sys.stdout.close()\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, TOKEN_ENV: token})
    pid = int(proc.stdout.readline())
    proc.wait()
    return pid


def test_reap_finds_a_token_carrier_started_after_the_worker_and_reads_no_older_process():
    import psutil

    token = secrets.token_hex(8)
    started = time.time()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])   # the worker, already ended
    gone.wait()
    daemon = _daemon(token)
    try:
        # Looked for only among processes older than the worker (a start 60 s on): not found.
        assert reap(gone.pid, token, since=time.time() + 60) == []
        assert psutil.pid_exists(daemon)
        # Among those started since the worker: found outside the tree, and killed.
        assert reap(gone.pid, token, since=started) == [daemon]
        assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


def test_a_workers_tree_is_the_one_psutil_finds_with_the_children_files_or_without(tree, monkeypatch):
    """The memory and CPU rules read the tree from the children files (``proctree``); it is the
    tree a scan of every process's parent finds, and so is it where the kernel has no such files."""
    import psutil

    from harness.core import proctree
    from harness.run.processes import _tree, tree_cpu

    expected = sorted([tree.pid, *(p.pid for p in psutil.Process(tree.pid).children(recursive=True))])
    assert len(expected) == 2 and sorted(p.pid for p in _tree(tree.pid)) == expected
    with monkeypatch.context() as m:
        m.setattr(proctree, "children_files", lambda pid: None)
        assert sorted(p.pid for p in _tree(tree.pid)) == expected
    assert tree_cpu(tree.pid) > 0 and tree_rss(tree.pid) > 64 * MIB


def test_a_group_process_ends_its_live_descendants_not_its_zombies(monkeypatch):
    """``group_process.descendants`` (what a group's end kills): every live descendant, a child
    that ended and waits to be reaped left out, from the children files or from a scan of /proc."""
    from harness.core import proctree
    from harness.worker import group_process

    code = ("import os, subprocess, sys, time\n"
            "if os.fork() == 0:\n    os._exit(0)\n"              # a zombie: never waited for
            "sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "time.sleep(0.2)\n"
            "print(sleeper.pid, flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        sleeper = int(proc.stdout.readline())
        everyone = proctree.descendants(proc.pid)
        assert sleeper in everyone and len(everyone) == 2            # the zombie is a child still
        assert group_process.descendants(proc.pid) == [sleeper]
        with monkeypatch.context() as m:
            m.setattr(proctree, "children_files", lambda pid: None)
            assert group_process.descendants(proc.pid) == [sleeper]
            assert sorted(proctree.descendants(proc.pid)) == sorted(everyone)
    finally:
        for pid in proctree.descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
