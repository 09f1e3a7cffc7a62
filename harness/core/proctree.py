"""A process's descendants, read from ``/proc``: the children files where the kernel has them, else
one scan of every process. Both sides use it: the runner's watching of a worker's tree (its memory
and CPU, several times a second) and its clean-up, the worker's load probe (a runtime host the timed
process talks to) and a group's clean-up (``group_process.end_descendants``). Standard library only."""
from __future__ import annotations

import contextlib
from pathlib import Path

_PROC = Path("/proc")


def children_files(pid: int) -> list[int] | None:
    """The child pids of a process from ``/proc/<pid>/task/<tid>/children`` (one file per thread:
    a child is listed under the thread that forked it), or None where the kernel has no such files
    (``CONFIG_PROC_CHILDREN``). A few files per process, where a scan of ``/proc`` reads one per
    process of the machine (about 4 ms with 70 processes)."""
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return None
    found: list[int] = []
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            if task.exists():
                return None          # the thread is there, its children file is not
        except (OSError, ValueError):
            continue                 # a thread that ended meanwhile
    return found


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()   # "pid (comm) state ppid ...": comm may hold ")"
    try:
        return fields[0], int(fields[1])
    except (IndexError, ValueError):
        return None


def scan_children(zombies: bool = True) -> dict[int, list[int]]:
    """Every process's children by parent pid, from one scan of /proc (``zombies=False``: a
    process that has ended and waits to be reaped is left out)."""
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in _PROC.iterdir():
            if entry.name.isdigit():
                found = _state_and_parent(int(entry.name))
                if found is not None and (zombies or found[0] != "Z"):
                    parents.setdefault(found[1], []).append(int(entry.name))
    return parents


def _zombie(pid: int) -> bool:
    found = _state_and_parent(pid)
    return found is None or found[0] == "Z"


def descendants(pid: int, zombies: bool = True) -> list[int]:
    """The descendants of a process (children files where the kernel has them, else one scan of
    /proc); ``zombies=False``: only those still running (a zombie has no children of its own)."""
    found: list[int] = []
    todo, scanned = [pid], None
    while todo:
        parent = todo.pop()
        children = children_files(parent) if scanned is None else None
        if children is None:
            scanned = scanned if scanned is not None else scan_children(zombies)
            children = scanned.get(parent, [])
        elif not zombies:
            children = [c for c in children if not _zombie(c)]
        found += children
        todo += children
    return found
