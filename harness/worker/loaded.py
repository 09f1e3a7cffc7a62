"""What a case loaded: the source files its construction, reference run and export imported or
opened from outside the environment's installed packages and the standard library.

The worker watches the case's stages (``CaseFiles.watch``): Python's ``open`` audit event gives
every file opened for reading (``open``, ``io.open``, ``numpy.load``, ``torch.load``, ``json`` and
``yaml`` readers all go through it), and ``sys.modules`` gives every imported module's file
(``__file__``). Files under the interpreter's prefixes (the environment's site-packages and the
standard library), the harness's result code (``core/``, ``run/``, ``runtimes/``: keyed by its own
hash), the run directory, the export's own folder and ``/proc``,
``/sys``, ``/dev``, files the process opened for writing itself (an exported file read back, a
cache it filled, a module a library generates), files in the temporary folder outside the matrix
file's folder, and bytecode caches (``__pycache__``: the source is the input) are not the case's
inputs and are left out. Declared files (``fn.data_files``
on the case function, ``data_files`` globs on the matrix entry) are always in.

The set, with each file's content hash (``harness.core.files.file_digest``), is the record's
``case_files``: the cell cache and the gate reuse a stored cell only while every one of them is
unchanged. In a process that runs several groups the set is the union of everything watched so
far (a module imported by an earlier group is still imported): more files than the case needs
cost a re-run when one of them changes, never a stale verdict. Not seen: files opened by native
code without Python's ``open`` (a C++ library reading a path itself), environment variables and
the network.
"""
from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from harness.core.files import case_file_key, expand_declared, file_digest  # noqa: F401 (re-exported)
from harness.core.paths import RESULT_CODE_DIRS

# The harness's result code is keyed by its own hash (harness.store.provenance.RESULT_CODE); the
# rest of it that a worker imports (the probes, the zoo) builds cases and counts as case files.
_HARNESS = Path(__file__).resolve().parent.parent
_RESULT_CODE_DIRS = tuple(str(_HARNESS / d) + os.sep for d in RESULT_CODE_DIRS)
_READ_MODES = frozenset("rb")   # an open for reading only: no 'w', 'a', 'x' or '+'
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_TMP = os.path.realpath(tempfile.gettempdir()) + os.sep


def _excluded_roots(extra: Iterable[str] = ()) -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/proc", "/sys", "/dev"}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            roots.add(sysconfig.get_paths()[name])
    roots |= {str(p) for p in extra}
    out = set()
    for root in roots:
        if root:
            with contextlib.suppress(OSError):
                out.add(os.path.realpath(root).rstrip(os.sep) + os.sep)
    return tuple(sorted(out))


# A module's file → its real path. ``files`` resolves every imported module's file at each
# group's end (some 3,000 with torch, each ``realpath`` one ``lstat`` per path component); a
# module's file stays where it is while the worker runs, so each is resolved once, and those the
# warm parent imported once for all the groups forked from it (``resolve_imported``).
_REAL_PATHS: dict[str, str] = {}


def _real_module_path(name: str) -> str:
    real = _REAL_PATHS.get(name)
    if real is None:
        real = _REAL_PATHS[name] = os.path.realpath(name)
    return real


# A loaded module's ``__file__``, by its name in ``sys.modules`` with the module it was read from:
# asking each of some 2,900 modules again at every group's end took 2.7 ms against 1.0 ms (``nox -s
# bench -- --part worker_overheads``; a module without a file goes through its own ``__getattr__``,
# where it has one, to an AttributeError).
_MODULE_FILES: dict[str, tuple[object, object]] = {}


def _module_files() -> Iterator[str]:
    """The file of every module imported so far."""
    for key, module in list(sys.modules.items()):
        known = _MODULE_FILES.get(key)
        if known is not None and known[0] is module:
            name = known[1]
        else:
            name = getattr(module, "__file__", None)
            _MODULE_FILES[key] = (module, name)
        if isinstance(name, str):
            yield name


def resolve_imported() -> None:
    """Resolve the files of the modules imported so far (the warm parent, before it forks)."""
    for name in _module_files():
        with contextlib.suppress(OSError, ValueError):
            _real_module_path(name)


class CaseFiles:
    """Collects the files the watched code loads (one instance per worker process)."""

    _active: "CaseFiles | None" = None
    # Files this process opened for writing since this module was imported (before torch: the
    # worker imports it first), watched or not: outputs, never inputs (torch 2.6 writes a module
    # into a temporary folder and imports it).
    written: set[str] = set()

    def __init__(self, exclude: Iterable[str | Path] = ()) -> None:
        self.opened: set[str] = set()
        self.roots = _excluded_roots(str(p) for p in exclude) + _RESULT_CODE_DIRS

    @classmethod
    def _audit(cls, event: str, args: tuple) -> None:
        if event != "open":
            return
        path, mode = args[0], args[1] if len(args) > 1 else "r"
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if not isinstance(path, (str, bytes)):
            return
        if (isinstance(mode, str) and set(mode) - _READ_MODES) or flags & _WRITE_FLAGS:
            cls.written.add(os.fsdecode(path))
        elif cls._active is not None:
            cls._active.opened.add(os.fsdecode(path))

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Record the files opened for reading while the block runs."""
        previous, CaseFiles._active = CaseFiles._active, self
        try:
            yield
        finally:
            CaseFiles._active = previous

    def _keep(self, path: str, base_dir: str | None, written: set[str], module: bool = False) -> str | None:
        try:
            real = _real_module_path(path) if module else os.path.realpath(path)
        except (OSError, ValueError):
            return None
        if real.startswith(self.roots) or not os.path.isfile(real):
            return None
        if real.endswith((".pyc", ".pyo")) or f"{os.sep}__pycache__{os.sep}" in real:
            return None   # bytecode the import system caches: its source file is the input
        if real in written or (real.startswith(_TMP) and not (base_dir and real.startswith(base_dir))):
            return None   # written by this process, or generated in the temporary folder by a library
        return real

    def files(self, declared: Iterable[str | Path] = (), base_dir: str | Path | None = None) -> set[str]:
        """Every file loaded so far (modules and opened files), plus the declared ones; files
        in the temporary folder count only inside ``base_dir`` (a repository checked out there)."""
        base = os.path.realpath(base_dir) + os.sep if base_dir is not None else None
        written = {os.path.realpath(p) for p in CaseFiles.written}
        found = set()
        for name in _module_files():
            if kept := self._keep(name, base, written, module=True):
                found.add(kept)
        for name in self.opened:
            if kept := self._keep(name, base, written):
                found.add(kept)
        for name in declared:
            real = os.path.realpath(name)
            if os.path.isfile(real):
                found.add(real)
        return found

    def digests(self, base_dir: Path, declared: Iterable[str | Path] = ()) -> dict[str, str]:
        """``case_files`` of a record: path (relative to ``base_dir`` where inside it) → hash."""
        out = {}
        for path in sorted(self.files(declared, base_dir)):
            digest = file_digest(path)
            if digest is not None:
                out[case_file_key(path, base_dir)] = digest
        return out


sys.addaudithook(CaseFiles._audit)   # once per process, at import: it cannot be removed
