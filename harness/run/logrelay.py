"""The runner's half of log capping (venv workers): the worker's stdout/stderr come through a
pipe, and ``LogRelay`` writes each group's part of that stream into the group's ``CappedLog``,
switching at the marker lines the worker writes (``harness.core.wire.log_marker``). Each log keeps
its first and last ``log_max_mb / 2`` with the notice the worker's own cap writes too
(``harness.core.wire.cut_notice``; the worker's half: ``harness.worker.logcap``).
"""
from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Callable

from harness.core.wire import cut_notice, log_marker


class CappedLog:
    """One log file written with a cap: the first half of ``max_bytes`` goes to the file as it
    comes, the last half is kept in memory (whole chunks, trimmed on close); what falls between is
    counted and replaced by one line saying how much was cut. A file that already exists (a group
    retried in a fresh worker) counts towards the head."""

    def __init__(self, path: Path, max_bytes: int | None) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.fh = open(path, "ab")
        half = (max_bytes or 0) // 2
        self.head_left = None if not max_bytes else max(0, half - self.fh.tell())
        self.tail_max = 0 if not max_bytes else max_bytes - half
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.cut = 0

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.head_left is None:
            self.fh.write(data)
            return
        if self.head_left:
            n = min(self.head_left, len(data))
            self.fh.write(data[:n])
            self.head_left -= n
            data = data[n:]
        if data:
            self.tail.append(data)
            self.tail_len += len(data)
            while self.tail and self.tail_len - len(self.tail[0]) >= self.tail_max:
                dropped = self.tail.popleft()
                self.tail_len -= len(dropped)
                self.cut += len(dropped)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        if self.fh.closed:
            return
        data = b"".join(self.tail)
        if len(data) > self.tail_max:
            self.cut += len(data) - self.tail_max
            data = data[len(data) - self.tail_max:]
        if self.cut:
            self.fh.write(cut_notice(self.cut, self.max_bytes or 0))
        self.fh.write(data)
        self.fh.close()


class LogRelay:
    """Writes the worker's output stream into capped logs: the worker log, or the log of the group
    named by the last marker line (``log_marker``) in the stream."""

    def __init__(self, worker_log: Path, log_dir: Path, max_bytes: int | None, nonce: str,
                 known_groups: set[str], on_group_closed: Callable[[str], None]) -> None:
        self.log_dir, self.max_bytes = log_dir, max_bytes
        self.prefix = log_marker(nonce, "")[:-1]          # the marker up to the group id
        self.known = known_groups
        self.on_group_closed = on_group_closed
        self.worker = CappedLog(worker_log, max_bytes)
        self.current = self.worker
        self.groups: dict[str, CappedLog] = {}
        self.closed: set[str] = set()
        self.pending = b""

    def feed(self, data: bytes) -> None:
        buf = self.pending + data
        while (i := buf.find(self.prefix)) >= 0:
            j = buf.find(b"\n", i)
            if j < 0 and len(buf) - i < 512:
                break                      # the rest of the marker line is still in the pipe
            self.current.write(buf[:i])
            if j < 0:                      # not a marker after all: keep the bytes
                self.current.write(buf[i:i + 1])
                buf = buf[i + 1:]
                continue
            self._switch(buf[i + len(self.prefix):j].decode(errors="replace"))
            buf = buf[j + 1:]
        i = buf.find(self.prefix)
        keep = len(buf) - i if i >= 0 else self._partial(buf)
        self.current.write(buf[:len(buf) - keep])
        self.pending = buf[len(buf) - keep:]
        self.current.flush()

    def _partial(self, buf: bytes) -> int:
        """Length of the longest end of ``buf`` that begins a marker."""
        for k in range(min(len(self.prefix) - 1, len(buf)), 0, -1):
            if buf.endswith(self.prefix[:k]):
                return k
        return 0

    def _switch(self, gid: str) -> None:
        if gid not in self.known or gid in self.closed:
            self.current = self.worker     # the worker's own output, or an unknown/forged name
            return
        for other in [g for g in self.groups if g != gid]:
            self._close_group(other)       # groups run one after the other: that one is over
        if gid not in self.groups:
            self.groups[gid] = CappedLog(self.log_dir / f"{gid}.log", self.max_bytes)
        self.current = self.groups[gid]

    def _close_group(self, gid: str) -> None:
        self.groups.pop(gid).close()
        self.closed.add(gid)
        if self.current not in self.groups.values():
            self.current = self.worker
        self.on_group_closed(gid)

    def close(self) -> None:
        self.current.write(self.pending)
        self.pending = b""
        for gid in list(self.groups):
            self._close_group(gid)
        self.worker.close()
