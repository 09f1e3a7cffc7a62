"""A worker's process tree: its CPU time and memory (what the timeout and memory rules read),
and its clean-up, in one place: ``reap`` (a worker's tree and every process carrying its token),
``kill_session`` (the worker's session), ``remove_scratch`` (what an ended worker left in its
scratch folder), ``end_child_processes`` (all this runner still runs)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import psutil

from harness.core.proctree import descendants
from harness.core.wire import SCRATCH_PREFIX, TOKEN_ENV


def tree_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of a process, its descendants and the children it reaped
    (a group's finished process); None once it is gone."""
    try:
        procs = _tree(pid)
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


def _tree(pid: int) -> list[psutil.Process]:
    """The process and its live descendants. Read from the children files (``proctree``): the
    memory rule reads a worker's tree four times a second, and psutil's ``children`` reads the
    parent of every process of the machine each time."""
    root = psutil.Process(pid)
    procs = [root]
    for child in descendants(pid):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(child))
    return procs


def tree_rss(pid: int, limit: int | None = None) -> int:
    """Resident memory of a process and its descendants, in bytes (0 once it is gone). Each
    process counts its proportional share of pages it shares (PSS): a group's process forked
    from the warm worker shares the worker's imported torch, which counts once, not twice.

    With ``limit``, the sum of plain resident sizes (``/proc/PID/statm``, cheap) is read first:
    it is never below the PSS sum, so when it is within ``limit`` it is returned as it is and
    the PSS (``smaps_rollup``, which walks every page table) is read only when it is over."""
    try:
        procs = _tree(pid)
    except psutil.Error:
        return 0
    if limit is not None:
        bound = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                bound += p.memory_info().rss
        if bound <= limit:
            return bound
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            try:
                total += p.memory_full_info().pss
            except (AttributeError, psutil.AccessDenied):
                total += p.memory_info().rss
    return total


# How far a process's start time (psutil: boot time, read in whole seconds, plus clock ticks)
# may lie before the wall clock's reading of the same moment.
START_SLACK_S = 5.0


def reap(worker_pid: int, token: str, keep: set[int] = frozenset(), since: float | None = None) -> list[int]:
    """Kill every process of the worker's tree and every process carrying its token, but those in
    ``keep``; returns their pids. The token finds processes that left the tree (re-parented to
    init by a double fork, or in a session of their own).

    ``since``: when the worker was started (``time.time()`` before it). Only processes started
    after it (less ``START_SLACK_S``) can carry its token, so only theirs are read: an
    environment is a file read per process, and a latency worker reaps before each of its groups."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        for child in _tree(worker_pid)[1:]:
            found[child.pid] = child
    me = os.getpid()
    for proc in psutil.process_iter(["create_time"]):
        if proc.pid == me or proc.pid in found:
            continue
        created = proc.info.get("create_time")
        if since is not None and created is not None and created < since - START_SLACK_S:
            continue
        try:
            environ = proc.environ()
        except psutil.Error:
            continue
        if environ.get(TOKEN_ENV) == token:
            found[proc.pid] = proc
    victims = []
    for pid, proc in found.items():
        if pid in keep or pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            proc.kill()
            victims.append(proc)
    psutil.wait_procs(victims, timeout=2)
    return [p.pid for p in victims]


def remove_scratch(path: str | None) -> None:
    """An ended worker's scratch folder (named in its hello), if the worker did not remove it:
    a worker killed mid-group leaves its exports there. Only a folder of the worker's own name."""
    if not path:
        return
    folder = Path(path)
    if folder.is_absolute() and folder.name.startswith(SCRATCH_PREFIX) and folder.is_dir() \
            and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)


def kill_session(pid: int) -> None:
    """Kill the session (process group) a worker leads: the worker and what stayed in it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def end_child_processes() -> None:
    """Stop what this runner still runs (an environment being installed by the prefetch thread),
    so that it can exit now; an environment cut mid-install has no marker and is rebuilt."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
