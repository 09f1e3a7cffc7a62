"""A case's files by content: the digest of one file, how a record names it (``case_files``), and
whether a stored record's files are still the ones on disk. One place for the rule the cell
cache, the gate and bisect all apply before a stored cell stands for a new one. Standard library
only: the worker records the files, the runner checks them.
"""
from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import Iterable

_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def file_digest(path: str | Path) -> str | None:
    """The content hash of a file (sha256, 16 hex digits); None when it cannot be read.
    Remembered per (path, inode, size, mtime) within a process: many cells share one file."""
    path = str(path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    memo = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    if memo in _DIGESTS:
        return _DIGESTS[memo]
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    _DIGESTS[memo] = out = digest.hexdigest()[:16]
    return out


def case_file_key(path: str | Path, base_dir: str | Path) -> str:
    """How a record names a case file: relative to the matrix file's folder when inside it (a
    clone elsewhere still matches), else absolute."""
    real, base = os.path.realpath(path), os.path.realpath(base_dir)
    try:
        rel = os.path.relpath(real, base)
    except ValueError:
        return real
    return real if rel.startswith(os.pardir + os.sep) or rel == os.pardir else rel


def case_file_path(name: str, base_dir: str | Path) -> str:
    return name if os.path.isabs(name) else os.path.join(str(base_dir), name)


def changed_case_files(case_files: dict[str, str] | None, base_dir: str | Path) -> list[str]:
    """The recorded files whose content is no longer the recorded one (changed or gone)."""
    return [name for name, digest in sorted((case_files or {}).items())
            if file_digest(case_file_path(name, base_dir)) != digest]


def differing_case_files(a: dict[str, str] | None, b: dict[str, str] | None) -> list[str]:
    """Files two records both loaded, with different contents (a file only one side loaded
    says nothing: an import can depend on the torch release)."""
    a, b = a or {}, b or {}
    return sorted(name for name in set(a) & set(b) if a[name] != b[name])


def expand_declared(patterns: Iterable[str], base: str | Path) -> list[str]:
    """Declared data files (paths or globs, relative to ``base``) as existing file paths."""
    out: list[str] = []
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else os.path.join(str(base), pattern)
        out += [p for p in sorted(glob.glob(full, recursive=True)) if os.path.isfile(p)]
    return out
