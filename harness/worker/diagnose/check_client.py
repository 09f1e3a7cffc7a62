"""Polygraphy's ``--check`` for a reduction with a check server (``harness.worker.diagnose.reduce``).

``python -I -S check_client.py SOCKET MODEL FALLBACK…``: asks the reduction's check server (a warm
process of the cell's environment that forks a copy of itself per check) whether MODEL fails the
way the cell did, prints its answer and exits with its code (1: the same failure). Where the server
cannot be reached it becomes FALLBACK, the fresh-process check (``reduce check --spec SPEC MODEL``),
so a dead server costs time, never an answer.

Standard library only, run without site-packages: this process starts once per candidate graph.
"""
from __future__ import annotations

import json
import os
import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3:   # never exit 1: that is Polygraphy's "fails the same way"
        print(f"usage: check_client.py SOCKET MODEL FALLBACK…, got {argv!r}", file=sys.stderr)
        return 2
    sock_path, model, *fallback = argv
    model = os.path.abspath(model)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(sock_path)
            sock.sendall(model.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        answer = json.loads(data)
        code, why = int(answer["code"]), str(answer["why"])
    except (OSError, ValueError, KeyError, TypeError):
        sys.stdout.flush()
        os.execv(fallback[0], fallback)
    print(why, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
