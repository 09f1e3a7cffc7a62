"""A fresh process for every export group, forked from a warm parent (the worker).

The worker imports torch, the exporter packages and the runtimes once (``preload``) and runs
nothing; for each group it forks a child that builds the case, exports and runs the group's
cells, sending its events on the worker's pipe, then ends. Nothing one export leaves behind in
the process (dynamo caches, registered custom ops, global config a case touches, RNG, thread
settings) reaches the next group, so a verdict does not depend on which groups the same worker
ran before, and a fresh process costs a fork, not a torch import.

The parent keeps today's containment per child:

- a child that ends without finishing its group (a signal, any exit status, an exception that
  left the worker loop) ends the parent the same way (``mirror``): the runner sees the death of
  a worker, charges the cell (or the stage) it was in, and retries it in a fresh worker;
- the parent is a child subreaper: what a case forks, daemonised or not, stays in its tree and is
  killed once the group's process has ended (``end_descendants``), before the next group forks;
- the child dies with its parent (``PR_SET_PDEATHSIG``), the parent with the runner; the runner's
  timeout and memory limit see the child as part of the worker's process tree.

Standard library only (the worker runs this inside every environment).
"""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, TypeVar

from harness.core import proctree
from harness.core.wire import FORK_ENV

T = TypeVar("T")

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36

# What the warm parent imports before its first fork: torch and what the exporters and runtimes
# import at their first use (torch.export's tracer imports torch._dynamo, seconds of imports a
# long-lived worker paid once), and the harness's own worker-side modules. Importing starts no
# thread pool of torch's (ATen's intra-op pool, OpenMP, MKL and oneDNN start at the first
# parallel op); a module that is not installed in the environment is left out.
PRELOAD = ("numpy", "torch", "torch.onnx", "torch.export", "torch.export._trace", "torch._dynamo",
           "torch.onnx._internal.exporter._capture_strategies", "torch.onnx._internal.exporter._core",
           "torch.onnx._internal.exporter._registration", "torch.onnx._internal.torchscript_exporter.utils",
           "onnx", "onnx.checker", "onnx.shape_inference", "onnxscript", "onnxscript.function_libs.torch_lib.ops",
           "onnxruntime", "openvino")

FORKING = False                     # True while the parent forks a group's process
PARENT: int | None = None           # in a group's process: the warm parent's pid


def enabled() -> bool:
    return os.environ.get(FORK_ENV, "1") != "0" and hasattr(os, "fork")


def preload() -> list[str]:
    """Import ``PRELOAD`` (each that is installed) and build the dynamo exporter's operator
    table (``prepare_exporter``); the names imported, and "torchlib-registry" when built."""
    import importlib

    done = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed here, or broken: the group imports it itself
            continue
        done.append(name)
    done += _preload_own()
    if prepare_exporter():
        done.append("torchlib-registry")
    from harness.worker.loaded import resolve_imported

    resolve_imported()    # the forked groups' case files then resolve only what they import
    return done


def _preload_own() -> list[str]:
    """The harness's own modules every group uses, imported by statement (so that the import
    checks see them); their names."""
    try:
        from harness import runtimes
        from harness.worker import cases, dims, export, inputs, parity
    except Exception:  # noqa: BLE001 - a group imports them itself and fails there, as a cell
        return []
    return [m.__name__ for m in (cases, export, parity, dims, inputs, runtimes)]


def prepare_exporter() -> bool:
    """Build torch.onnx's registry of the ONNX functions it translates aten ops to (onnxscript's
    torchlib, compiled from its source: data, the same for every export of this environment; a
    first dynamo export spends seconds on it), with torchlib's table of those functions and their
    ONNX signatures kept for every later export (``keep_torchlib_table``, ``keep_signatures``).
    No model is traced or run and no thread starts."""
    try:
        from torch.onnx._internal.exporter import _registration

        keep_torchlib_table()
        _registration.ONNXRegistry.from_torchlib()
    except Exception:  # noqa: BLE001 - an older torch.onnx: the first export builds it
        return False
    return True


def _torchlib_apis() -> Any:
    """The onnxscript module torch.onnx asks for torchlib's table (it names it per release)."""
    import importlib

    from torch.onnx._internal import _lazy_import

    apis = _lazy_import.onnxscript_apis
    return importlib.import_module(apis._name) if hasattr(apis, "_name") else apis


def keep_torchlib_table() -> bool:
    """Make onnxscript's ``get_torchlib_ops`` (which torch.onnx calls at every dynamo export to
    build its registry) compute its table once per content of torchlib's registry.

    The table names each torchlib function with its domain, which onnxscript finds by parsing the
    function's source again on every call (``function_ir``): about half a second of every export
    of a small model, for the same answer. The table is kept with the identity of every function
    in onnxscript's registry and made again when that changes (a case that registers its own
    torchlib function), and each caller gets a list of its own. The files are the ones a plain
    export writes: ``harness.worker.capture_proof`` exports its per-opset side without it
    (``forget_torchlib_table``) and compares the bytes. False where this onnxscript has no such
    table."""
    apis = _torchlib_apis()
    original = getattr(apis, "get_torchlib_ops", None)
    if original is None or _kept_original(apis) is not None:
        return original is not None
    kept: dict[tuple, list] = {}

    def get_torchlib_ops() -> list:
        from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 - ops registers them

        key = tuple((name, tuple(map(id, f.overloads)), tuple(map(id, f.complex)))
                    for name, f in registration.default_registry.items())
        if key not in kept:
            kept.clear()
            kept[key] = original()
        return list(kept[key])

    get_torchlib_ops.harness_original = original  # type: ignore[attr-defined]
    apis.get_torchlib_ops = get_torchlib_ops
    keep_signatures()
    return True


def _signature_api() -> tuple[Any, str] | None:
    """Where this torch.onnx infers a function's ONNX signature, which it does for each of
    torchlib's functions at every registry build: ``_schemas.op_signature_from_function`` (2.10
    and later) or the classmethod ``_schemas.OpSignature.from_function`` (before); None elsewhere."""
    try:
        from torch.onnx._internal.exporter import _schemas
    except Exception:  # noqa: BLE001 - an older torch.onnx: nothing to keep
        return None
    if callable(getattr(_schemas, "op_signature_from_function", None)):
        return _schemas, "op_signature_from_function"
    owner = getattr(_schemas, "OpSignature", None)
    if isinstance(getattr(owner, "__dict__", {}).get("from_function"), classmethod):
        return owner, "from_function"
    return None


def _kept_signature(found: tuple[Any, str]) -> Any:
    """The original of a signature inference ``keep_signatures`` wrapped, else None."""
    raw = found[0].__dict__.get(found[1])
    return getattr(getattr(raw, "__func__", raw), "harness_original", None)


def keep_signatures() -> bool:
    """Make torch.onnx's signature inference answer once per function and arguments.

    Every dynamo export builds torch.onnx's registry, and building it infers the ONNX signature
    of each of torchlib's functions again from its annotations (``typing.get_type_hints``,
    ``inspect.signature``): 0.4 to 0.5 s of CPU per export, the same answer each time. The
    answer is kept with the function itself (so its identity cannot be reused by another object)
    and the other arguments; arguments that cannot be a key, and a call that raises, go to the
    original every time. The files are the ones a plain export writes (``capture_proof``, as for
    the table). False where this torch.onnx has no such inference."""
    found = _signature_api()
    if found is None:
        return False
    if _kept_signature(found) is not None:
        return True
    owner, name = found
    raw = owner.__dict__[name]
    method = isinstance(raw, classmethod)
    infer = raw.__func__ if method else raw
    kept: dict[tuple, tuple[Any, Any]] = {}

    def signature(*args: Any, **kwargs: Any) -> Any:
        rest = args[1:] if method else args
        if not rest:
            return infer(*args, **kwargs)
        func = rest[0]
        try:
            key = (id(args[0]) if method else None, id(func), rest[1:], tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            return infer(*args, **kwargs)
        hit = kept.get(key)
        if hit is None or hit[0] is not func:
            hit = kept[key] = (func, infer(*args, **kwargs))
        return hit[1]

    signature.harness_original = raw  # type: ignore[attr-defined]
    setattr(owner, name, classmethod(signature) if method else signature)
    return True


def forget_signatures() -> None:
    """Undo ``keep_signatures`` in this process."""
    found = _signature_api()
    original = _kept_signature(found) if found is not None else None
    if original is not None:
        setattr(found[0], found[1], original)


def _kept_original(apis: Any) -> Any:
    """onnxscript's own ``get_torchlib_ops`` where ``keep_torchlib_table`` wrapped it, else None."""
    return getattr(getattr(apis, "get_torchlib_ops", None), "harness_original", None)


def torchlib_table_kept() -> bool:
    """Whether this process's dynamo exports take torchlib's table as ``keep_torchlib_table`` keeps it."""
    return _kept_original(_torchlib_apis()) is not None


def forget_torchlib_table() -> None:
    """Undo ``keep_torchlib_table`` in this process: torch.onnx's export as it comes."""
    apis = _torchlib_apis()
    original = _kept_original(apis)
    if original is not None:
        apis.get_torchlib_ops = original
    forget_signatures()


def freeze() -> None:
    """Move every object of this process to the garbage collector's permanent generation
    (``gc.freeze``) before a fork: the child's collections then skip the parent's objects instead
    of walking (and writing the headers of) all of them, which copied most of the warm parent's
    pages into each child (copy-on-write) and cost a group's process about a quarter of its time
    on a small group. The parent's own garbage stays uncollected; it runs nothing between forks."""
    gc.freeze()


def thread_count() -> int:
    """Threads of this process (Linux; 1 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def in_group_process() -> bool:
    return PARENT is not None and os.getpid() != PARENT


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - no prctl on this libc: the worker lives without the death signal
        return False


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


class GroupDied(Exception):
    """A group's process ended without finishing its group; ``status`` as ``os.waitpid`` gives it."""

    def __init__(self, status: int) -> None:
        super().__init__(describe(status))
        self.status = status


def describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def per_group(groups: Iterable[T], on_child: Callable[[], None] = lambda: None) -> Iterator[T]:
    """Yield each group inside a fresh process forked from this one; in this process, wait for it.

    Used as ``for group in per_group(groups): <run the group>``: the loop body runs only in the
    child, which ends (``os._exit(0)``) when the body asks for the next group. The parent takes
    the next group only after the child and everything it started are gone; a child that did not
    finish raises ``GroupDied`` here. ``on_child`` runs first thing in each child."""
    global FORKING, PARENT
    parent = os.getpid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    for group in groups:
        _flush()
        freeze()
        done_r, done_w = os.pipe()
        FORKING = True
        try:
            pid = os.fork()
        except BaseException:
            FORKING = False
            os.close(done_r)
            os.close(done_w)
            raise
        if pid == 0:
            FORKING, PARENT = False, parent
            os.close(done_r)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:      # the parent died before prctl took effect
                os._exit(1)
            on_child()
            yield group
            # The loop body ran to its end in this process: say so, and end without cleanup
            # (atexit handlers and buffers are the parent's).
            _flush()
            os.write(done_w, b"1")
            os._exit(0)
        FORKING = False
        os.close(done_w)
        try:
            status = _wait(pid)
            os.set_blocking(done_r, False)   # a process the child left may still hold the pipe
            try:
                finished = os.read(done_r, 1) == b"1"
            except BlockingIOError:
                finished = False
        finally:
            os.close(done_r)
            end_descendants()
        if not finished:
            raise GroupDied(status)


def in_fresh_copy(fn: Callable[[], bool], timeout: float | None = None) -> int | None:
    """Run ``fn`` in a copy of this process forked for it (before this one has done anything it
    could carry over) and wait for it; its exit status, as ``os.waitpid`` gives it (0: ``fn``
    returned True). With ``timeout``, a copy still running after that many seconds is killed
    (with what it started) and the answer is None. The copy sends no events (the worker's
    ``leave_if_forked`` ends it if it tries)."""
    global FORKING
    _flush()
    freeze()
    FORKING = True
    try:
        pid = os.fork()
    except BaseException:
        FORKING = False
        raise
    if pid == 0:
        FORKING = False
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            ok = fn()
        except BaseException:  # noqa: BLE001 - the forked group reports any failure as a failed group
            traceback.print_exc()
            ok = False
        _flush()
        os._exit(0 if ok else 1)
    FORKING = False
    if timeout is None:
        return _wait(pid)
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except InterruptedError:
            continue
        if done:
            return status
        if time.monotonic() >= deadline:
            for child in [pid, *descendants(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            _wait(pid)
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue


def descendants(root: int | None = None) -> list[int]:
    """Pids of every live descendant of ``root`` (this process), zombies left out: a group's
    process ends with this, after each group (``harness.core.proctree``: the children files, a few
    per process, where a scan of /proc reads one per process of the machine)."""
    return proctree.descendants(os.getpid() if root is None else root, zombies=False)


def end_descendants(limit_s: float = 5.0) -> int:
    """Kill every process below this one (a subreaper: what a group's process left behind,
    daemons included) and reap them; returns how many were killed."""
    killed: set[int] = set()
    end = time.monotonic() + limit_s
    while True:
        found = descendants()
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        _reap_zombies()
        if not found or time.monotonic() > end:
            return len(killed)
        time.sleep(0.01)


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def mirror(status: int) -> None:
    """End this process as the group's process ended: by the same signal, or the same code."""
    _flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import faulthandler

        faulthandler.disable()              # the child printed its own traceback
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)                 # a signal whose default is not to end the process
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Around the worker's loop: a group's death ends the parent the same way (``mirror``); an
    exception or ``sys.exit`` that leaves the loop in a group's process ends that process alone,
    as it would have ended a long-lived worker (the traceback printed, the exit status kept)."""
    try:
        yield
    except GroupDied as died:
        # In the warm parent, or in a family's process whose group's process died
        # (harness.worker.capture_reuse): each ends the way the process below it ended.
        mirror(died.status)
    except BaseException as exc:
        if not in_group_process():
            raise
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        else:
            traceback.print_exc()
            code = 1
        _flush()
        os._exit(code)
