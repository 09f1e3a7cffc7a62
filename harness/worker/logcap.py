"""The worker's half of log capping: a block's output goes straight to the group's log file
(containers, repro), which ``cap_file`` cuts in place to its first and last ``log_max_mb / 2``.
Under the runner's relay (venv workers) the runner caps as it writes (``harness.run.logrelay``);
both write the same notice (``harness.core.wire.cut_notice``). Standard library only.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from harness.core.wire import CUT_NOTICE_START, cut_notice

_NOTICE_ROOM = 256
_CUT = re.compile(CUT_NOTICE_START)


def cap_file(path: Path, max_bytes: int | None) -> None:
    """Cut the middle of a log longer than ``max_bytes`` in place (first and last halves kept):
    writers holding it open with O_APPEND go on appending after the tail."""
    if not max_bytes:
        return
    try:
        size = os.path.getsize(path)
    except OSError:
        return
    if size <= max_bytes + _NOTICE_ROOM:
        return
    head, tail = max_bytes // 2, max_bytes - max_bytes // 2
    with open(path, "r+b") as fh:
        fh.seek(head)
        probe = fh.read(_NOTICE_ROOM)
        cut = size - head - tail
        # A notice of an earlier cut sits right after the head: add what it cut, minus itself.
        earlier = _CUT.match(probe)
        if earlier and (end := probe.find(b"]\n", earlier.end())) >= 0:
            cut += int(earlier.group(1)) - (end + 2)
        fh.seek(size - tail)
        last = fh.read(tail)
        fh.seek(head)
        fh.write(cut_notice(cut, max_bytes))
        fh.write(last)
        fh.truncate()
