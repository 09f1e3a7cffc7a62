"""Smallest failing graph: reduce a failing cell's ``model.onnx`` with Polygraphy's ``debug reduce``,
the failing runtime itself being the check.

Two halves; the runner's is ``harness.run.post.reduction``:
- runner side, ``reduce_run``: picks a stored run's cells that failed at load, run or parity and
  have a bundle, installs Polygraphy on demand into a folder of its own beside the environments
  (never into an environment: one stays exactly what its marker lists, and its name does not
  change), and starts the driver in the cell's own environment with that folder on PYTHONPATH;
  the outcome goes to the run's ``reductions.jsonl`` (a finished run's results are immutable;
  ``harness.store`` joins it into ``record.graph["reduced"]`` on read).
- environment side, ``python -m harness.worker.diagnose.reduce reduce|check``: reference values for every
  tensor at the failing shape (ONNX Runtime on the original file, up to the first node that
  fails), the check (the cell's runtime adapter loads and runs a candidate and must fail the way
  the record says: same stage, same exception type, same operator where the error names one;
  parity beyond the case's tolerance against the eager outputs or the reference values), then
  two Polygraphy passes (earliest failing outputs, then latest failing inputs) within one time
  budget; ``reduced.onnx`` and ``reduced_inputs.npz`` go to the bundle.

Environment side: standard library and numpy at module level; onnx, onnxruntime and the
runtimes lazily.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.status import Stage
from harness.core.wire import REDUCE_MODULE, Reduction

DEFAULT_TIMEOUT_S = 120.0
SAME, PASSES, OTHER = 1, 0, 3          # check exit codes: Polygraphy counts only SAME as failing


# ==== environment side: what to reproduce ====================================================

@dataclass
class Failure:
    """What the check must reproduce, read from the record."""

    stage: str
    types: list[str]          # exception type names the record's error mentions
    op: str | None = None     # the operator the error names ('running Reshape node')
    shape: int = 0            # which input set failed: 0 the example shape, 1 the second shape

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "Failure":
        error = rec.get("error") or ""
        types = [t for t in dict.fromkeys(re.findall(r"\b([A-Z][A-Za-z0-9_]*)\s*:", error))
                 if t not in ("SecondShapeError", "Name", "Status")]
        op = re.search(r"running (\w+) node", error)
        second = error.startswith(("SecondShapeError", "ParityError: second shape"))
        return cls(rec.get("stage") or "", types, op.group(1) if op else None, 1 if second else 0)

    def matches(self, exc: BaseException) -> bool:
        names, seen, e = [], set(), exc
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            names.append(type(e).__name__)
            e = e.__cause__ or e.__context__
        if self.types and not set(names) & set(self.types):
            return False
        return self.op is None or f"running {self.op} node" in str(exc) or self.op in str(exc)


def _short(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


# ==== environment side: values and the check =================================================

class TensorStore:
    """Named arrays on disk (names may hold '/', ':' …: stored under indices with a name index)."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        self.values = values

    def save(self, path: Path) -> None:
        names = list(self.values)
        np.savez(path, **{f"t{i}": self.values[n] for i, n in enumerate(names)})
        path.with_suffix(".json").write_text(json.dumps(names))

    @classmethod
    def load(cls, path: Path) -> "TensorStore":
        names = json.loads(Path(path).with_suffix(".json").read_text())
        with np.load(path) as data:
            return cls({n: data[f"t{i}"] for i, n in enumerate(names)})


def _graph_inputs(model: Any) -> list[Any]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def relax_inputs(model: Any, feeds: dict[str, np.ndarray], keep: set[str] = frozenset()) -> Any:
    """Make every declared input dim that disagrees with its value symbolic, so the runtime sees
    the values the original file saw (Polygraphy freezes intermediate shapes at one size). The
    original file's inputs (``keep``) stay as declared: a dim fixed there may be the failure."""
    for inp in _graph_inputs(model):
        value = feeds.get(inp.name)
        if inp.name in keep:
            continue
        tensor = inp.type.tensor_type
        if value is None or not inp.type.HasField("tensor_type") or not tensor.HasField("shape"):
            continue
        if len(tensor.shape.dim) != value.ndim:
            tensor.ClearField("shape")
            continue
        for axis, (dim, size) in enumerate(zip(tensor.shape.dim, value.shape)):
            if dim.HasField("dim_value") and dim.dim_value != size:
                dim.dim_param = f"{inp.name}_d{axis}"
    return model


def layerwise_values(model_path: Path, feeds: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
    """Every tensor ONNX Runtime (CPU) computes from ``feeds`` on the original file, up to the
    first node that fails there: the longest prefix of the (topologically ordered) nodes that
    runs, found by bisection."""
    import tempfile

    import onnx

    from harness.runtimes.ort_cpu import OrtCpuAdapter

    model = onnx.load(str(model_path))
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - types are a convenience here
        typed = model
    types = {v.name: v.type for v in [*typed.graph.value_info, *typed.graph.output, *typed.graph.input]}
    nodes = list(model.graph.node)
    inputs = {i.name for i in _graph_inputs(model)}
    use = {k: v for k, v in feeds.items() if k in inputs}

    def run_prefix(k: int) -> dict[str, np.ndarray]:
        m = copy.deepcopy(model)
        del m.graph.node[k:]
        del m.graph.output[:]
        names = []
        for node in nodes[:k]:
            for name in node.output:
                kind = types.get(name)
                if not name or (kind is not None and kind.WhichOneof("value") != "tensor_type"):
                    continue
                vi = onnx.helper.make_empty_tensor_value_info(name)
                if kind is not None:
                    vi.type.tensor_type.elem_type = kind.tensor_type.elem_type
                m.graph.output.append(vi)
                names.append(name)
        if not names:
            return {}
        path = Path(tmp) / f"prefix_{k}.onnx"
        onnx.save(m, str(path))
        try:
            with OrtCpuAdapter(path) as adapter:   # the graph outputs, in order: ``names``
                return dict(zip(names, adapter.infer(use)))
        finally:
            path.unlink(missing_ok=True)

    with tempfile.TemporaryDirectory(prefix="harness-layerwise-") as tmp:
        try:
            return {**use, **run_prefix(len(nodes))}
        except Exception:  # noqa: BLE001 - the whole graph fails here: find the longest prefix that runs
            pass
        lo, hi, best = 0, len(nodes) - 1, {}
        while lo <= hi and time.monotonic() < deadline:
            mid = (lo + hi) // 2
            try:
                best = run_prefix(mid)
                lo = mid + 1
            except Exception:  # noqa: BLE001 - the prefix fails to run whatever the cause: search shorter
                hi = mid - 1
    return {**use, **best}


@dataclass
class CheckSpec:
    """Everything the check needs, written once by the driver (check runs once per iteration)."""

    failure: Failure
    runtime: str
    runtime_options: dict[str, Any]
    threads: int
    precision: str
    values: str                       # TensorStore path: every tensor's value at the failing shape
    expected: str | None = None       # TensorStore path: eager outputs by graph output name
    atol: float = 1e-4
    rtol: float = 1e-3
    original_inputs: list[str] = field(default_factory=list)

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> "CheckSpec":
        data = json.loads(Path(path).read_text())
        data["failure"] = Failure(**data["failure"])
        return cls(**data)


def check_model(path: Path, spec: CheckSpec, values: TensorStore | None = None,
                expected: TensorStore | None = None) -> tuple[int, str]:
    """Run a candidate graph on the cell's runtime: (SAME, why) when it fails the way the cell
    did, (PASSES, …) when it does not fail, (OTHER, why) when it fails otherwise or cannot be fed."""
    import onnx

    from harness.runtimes import load_adapter
    from harness.runtimes.base import ActiveAdapters
    from harness.worker.parity import ParityError, compare_outputs

    values = values or TensorStore.load(Path(spec.values))
    model = onnx.load(str(path))
    feeds = {}
    for inp in _graph_inputs(model):
        if inp.name not in values.values:
            return OTHER, f"no reference value for input {inp.name!r}"
        feeds[inp.name] = values.values[inp.name]
    relaxed = Path(path).with_name(Path(path).stem + ".checked.onnx")
    onnx.save(relax_inputs(model, feeds, set(spec.original_inputs)), str(relaxed))
    stage, failure = spec.failure.stage, spec.failure
    active = ActiveAdapters()   # a candidate's adapter that will not close says nothing of it
    try:
        try:
            adapter = load_adapter(spec.runtime)(relaxed, threads=spec.threads, precision=spec.precision,
                                                 options=spec.runtime_options)
            adapter.prepare([{n: tuple(v.shape) for n, v in feeds.items()}])
            active.enter_context(adapter)
        except Exception as exc:  # noqa: BLE001 - the check classifies every failure
            if stage == Stage.LOAD.value and failure.matches(exc):
                return SAME, f"fails at load: {_short(exc)}"
            return OTHER, f"load: {_short(exc)}"
        if stage == Stage.LOAD.value:
            return PASSES, "loads"
        names = adapter.input_names()
        try:
            outputs = [np.asarray(o) for o in adapter.infer({n: feeds[n] for n in names if n in feeds})]
        except Exception as exc:  # noqa: BLE001 - the runtime's own failure is what the check compares
            if stage == Stage.RUN.value and failure.matches(exc):
                return SAME, f"fails at run: {_short(exc)}"
            return OTHER, f"run: {_short(exc)}"
        if stage == Stage.RUN.value:
            return PASSES, "runs"
        expected = expected or (TensorStore.load(Path(spec.expected)) if spec.expected else TensorStore({}))
        refs, acts = [], []
        for out, act in zip(model.graph.output, outputs):
            ref = expected.values.get(out.name, values.values.get(out.name))
            if ref is not None:
                refs.append(np.asarray(ref))
                acts.append(act)
        if not refs:
            return OTHER, "no reference for any output"
        try:
            compare_outputs(refs, acts, spec.atol, spec.rtol, "reduced graph")
        except ParityError as exc:
            return SAME, f"fails at parity: {exc}"
        return PASSES, "matches the reference"
    finally:
        active.close()
        relaxed.unlink(missing_ok=True)


# ==== environment side: the check server =====================================================
# Polygraphy runs its ``--check`` command once per candidate graph (about a hundred for a
# 150-node file). A fresh interpreter importing onnx, numpy and the runtime spent about 2 s of
# each; the server imports them once, never runs a graph itself, and forks a copy of itself per
# check (``group_process.in_fresh_copy``): each check still starts from a process no other check
# touched, and a runtime that crashes or hangs in one ends that copy only.

CHECK_CLIENT = Path(__file__).with_name("check_client.py")
READY = "check server ready"
ANSWER_MAX = 4000        # characters of a check's "why" (a pipe's buffer holds the whole answer)


def serve_checks(spec_path: Path, sock_path: Path, budget_s: float) -> int:
    """Answer checks on ``sock_path`` until killed: a model path in, ``{"code", "why"}`` out, each
    from a fresh copy of this process capped at what is left of ``budget_s``."""
    import socket

    from harness.runtimes import load_adapter
    from harness.worker import group_process as fresh

    deadline = time.monotonic() + budget_s
    fresh._prctl(fresh.PR_SET_PDEATHSIG, signal.SIGKILL)   # the driver's end is this server's
    spec = CheckSpec.read(spec_path)
    values = TensorStore.load(Path(spec.values))
    expected = TensorStore.load(Path(spec.expected)) if spec.expected else None
    import onnx  # noqa: F401 - imported once here, not once per check

    import harness.worker.parity  # noqa: F401

    adapter = load_adapter(spec.runtime)
    if adapter.unavailable_reason() is None:
        adapter.version()   # imports the runtime's own package; no session, no thread pool yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(sock_path))
        server.listen(4)
        print(READY, flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                request = b""
                while chunk := conn.recv(65536):
                    request += chunk
                model = Path(request.decode().strip())
                code, why = _forked_check(model, spec, values, expected, max(1.0, deadline - time.monotonic()))
                with contextlib.suppress(OSError):   # a client killed meanwhile (its pass ran out of time)
                    conn.sendall(json.dumps({"code": code, "why": why[:ANSWER_MAX]}).encode())


def _forked_check(model: Path, spec: CheckSpec, values: TensorStore, expected: TensorStore | None,
                  cap_s: float) -> tuple[int, str]:
    from harness.worker import group_process as fresh

    read, write = os.pipe()

    def child() -> bool:
        os.close(read)
        code, why = check_model(model, spec, values, expected)
        os.write(write, json.dumps({"code": code, "why": why[:ANSWER_MAX]}).encode())
        return True

    try:
        status = fresh.in_fresh_copy(child, timeout=cap_s)
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read()
    if status is None:
        return OTHER, f"the check ran past {cap_s:.3g} s"
    if status != 0 or not answer:
        return OTHER, f"the check's process {fresh.describe(status)}"
    data = json.loads(answer)
    return int(data["code"]), str(data["why"])


def _read_line(proc: subprocess.Popen, wait_s: float) -> str | None:
    """The next line ``proc`` writes on its stdout, stripped; None when none comes within ``wait_s``
    (or the process ended)."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=max(0.0, wait_s)):
            return None
    line = proc.stdout.readline()
    return line.strip() if line else None


class _WarmProcess:
    """A helper process of the driver (the check server, the pass host): started where this
    platform forks, ready once it prints its ready line, killed when the driver is done with it."""

    START_S = 60.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def _start(self, cmd: list[str], ready: str, budget_s: float, log: Any, otherwise: str,
               stdin: Any = None) -> bool:
        """Start ``cmd``; True once it is ready, else False (``otherwise`` logged when it was started)."""
        from harness.worker import group_process as fresh

        if not fresh.enabled():
            return False
        self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=log, text=True)
        if _read_line(self.proc, min(self.START_S, budget_s)) == ready:
            return True
        log.write(f"({otherwise})\n")
        self.close()
        return False

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CheckServer(_WarmProcess):
    """The driver's handle on a check server: ``command`` is Polygraphy's ``--check``; None where
    this platform does not fork or the server did not start (the fresh-process check then)."""

    def __init__(self, spec_path: Path, fallback: list[str], budget_s: float, log: Any) -> None:
        import tempfile

        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="harness-check-"))   # a socket's path is short
        self.sock = self.folder / "check.sock"
        self.command: list[str] | None = None
        if self._start([sys.executable, "-m", REDUCE_MODULE, "serve", "--spec", str(spec_path), "--socket",
                        str(self.sock), "--timeout", f"{budget_s:.1f}"], READY, budget_s, log,
                       "the check server did not start: each check runs in a fresh process"):
            self.command = [sys.executable, "-I", "-S", str(CHECK_CLIENT), str(self.sock), fallback[-1], *fallback]

    def close(self) -> None:
        import shutil

        super().close()
        shutil.rmtree(self.folder, ignore_errors=True)


# ==== environment side: the driver ===========================================================

def _ops(model: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in model.graph.node:
        out[node.op_type] = out.get(node.op_type, 0) + 1
    return dict(sorted(out.items()))


def _load_feeds(bundle: Path, index: int) -> dict[str, np.ndarray]:
    path = bundle / ("inputs.npz" if index == 0 else f"inputs_shape{index + 1}.npz")
    if not path.exists():
        raise FileNotFoundError(f"{path.name} missing from the bundle")
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _expected(bundle: Path, index: int, model: Any) -> TensorStore | None:
    path = bundle / ("expected.npz" if index == 0 else f"expected_shape{index + 1}.npz")
    if not path.exists():
        return None
    with np.load(path) as data:
        arrays = [data[f"output_{k}"] for k in range(len(data.files))]
    return TensorStore({out.name: arr for out, arr in zip(model.graph.output, arrays)})


# Polygraphy's advice: bisect first, then linear (one node at a time) on the smaller result;
# linear only where few nodes are left, so that it fits the budget.
PASSES_PLAN = (("outputs", "bisect"), ("outputs", "linear"), ("inputs", "bisect"), ("inputs", "linear"))
LINEAR_MAX_NODES = 64


def _polygraphy(model: Path, output: Path, direction: str, mode: str, check_cmd: list[str], work: Path,
                deadline: float, log: Any, host: "PassHost | None" = None) -> bool:
    """One `polygraphy debug reduce` pass ('outputs': earliest failing outputs; 'inputs': latest
    failing inputs), in a copy forked by ``host`` or else a fresh process; False when it did not
    finish in time or failed."""
    argv = ["debug", "reduce", str(model), "-o", str(output), "--mode", mode,
            "--no-reduce-inputs" if direction == "outputs" else "--no-reduce-outputs",
            "--data-loader-script", f"{work / 'loader.py'}:load_data",
            "--fail-code", str(SAME), "--check", *check_cmd]
    stopped = f"\n(reduce pass over {direction} stopped: time budget spent)\n"
    # A pass stopped mid-way leaves its candidate behind, and Polygraphy refuses to overwrite it.
    (work / "polygraphy_debug.onnx").unlink(missing_ok=True)
    if host is not None:
        log.write(f"$ (pass host) polygraphy {' '.join(argv)}\n")
        log.flush()
        status = host.run(argv, work, Path(log.name), max(1.0, deadline - time.monotonic()))
        if status != PassHost.GONE:
            if status is None:
                log.write(stopped)
                return False
            return status == 0 and output.exists()
    cmd = [sys.executable, "-m", REDUCE_MODULE, "polygraphy", "--values", str(work / "values.npz"), *argv]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.write(stopped)
        return False
    return proc.returncode == 0 and output.exists()


# ==== environment side: the pass host ========================================================
# Each Polygraphy pass started an interpreter that imported onnx, onnx-graphsurgeon, sympy (for
# ONNX Runtime's shape inference) and Polygraphy: 4 to 6 s of every pass. The pass host imports
# them once and forks a copy of itself per pass, as the check server does per check.

PASS_HOST_READY = "pass host ready"
POLYGRAPHY_PRELOAD = ("onnx", "onnx_graphsurgeon", "onnxruntime", "onnxruntime.tools.symbolic_shape_infer",
                      "polygraphy.tools", "polygraphy.tools.debug.subtool.reduce", "polygraphy.backend.onnx.loader",
                      "polygraphy.comparator", "polygraphy.tools.args.backend.onnx.loader")


def host_passes(values: Path) -> int:
    """``reduce pass-host``: one JSON request a line on stdin (``argv``: Polygraphy's arguments,
    ``cwd``, ``log``: the file its output is appended to, ``cap_s``: seconds), each run by
    ``polygraphy_main`` in a fresh copy of this process; one JSON line back, ``status``: the
    copy's exit status as ``os.waitpid`` gives it, None when it ran past the timeout (killed with
    what it started)."""
    import importlib

    from harness.worker import group_process as fresh

    fresh._prctl(fresh.PR_SET_PDEATHSIG, signal.SIGKILL)
    _ort_tools_without_torch()
    for name in POLYGRAPHY_PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass   # the pass imports it, or does without it, as a fresh interpreter would
    print(PASS_HOST_READY, flush=True)
    for line in sys.stdin:
        request = json.loads(line)

        def child() -> bool:
            fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(request["cwd"])
            return polygraphy_main(values, request["argv"]) == 0

        status = fresh.in_fresh_copy(child, timeout=float(request["cap_s"]))
        print(json.dumps({"status": status}), flush=True)
    return 0


class PassHost(_WarmProcess):
    """The driver's handle on a pass host; ``run`` answers None (ran past its time), an exit
    status, or ``GONE`` when the host cannot run it (the pass then runs in a fresh process)."""

    GONE = "gone"

    def __init__(self, values: Path, log: Any, budget_s: float) -> None:
        super().__init__()
        self._start([sys.executable, "-m", REDUCE_MODULE, "pass-host", "--values", str(values)], PASS_HOST_READY,
                    budget_s, log, "the pass host did not start: each Polygraphy pass runs in a fresh process",
                    stdin=subprocess.PIPE)

    def run(self, argv: list[str], cwd: Path, log_path: Path, timeout_s: float) -> int | None | str:
        if self.proc is None or self.proc.poll() is not None:
            return self.GONE
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "log": str(log_path),
                                              "cap_s": timeout_s}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return self.GONE
        line = _read_line(self.proc, timeout_s + 30.0)   # the host kills a pass at timeout_s itself
        if line is None:
            self.close()
            return None
        return json.loads(line)["status"]


def write_loader(work: Path, feeds: dict[str, np.ndarray]) -> None:
    """The failing shape's inputs and Polygraphy's data loader script reading them (``loader.py``)."""
    np.savez(work / "feeds.npz", **feeds)
    (work / "loader.py").write_text(
        "import numpy as np\n\n\ndef load_data():\n"
        f"    with np.load({str(work / 'feeds.npz')!r}) as data:\n"
        "        yield {k: data[k] for k in data.files}\n")


def reduce_bundle(bundle: Path, rec: dict[str, Any], timeout_s: float, work: Path) -> Reduction:
    """Reduce one bundle's model.onnx in this (the cell's) environment."""
    import onnx

    t0 = time.monotonic()
    deadline = t0 + timeout_s
    out = Reduction(timeout_s=timeout_s)
    original = bundle / "model.onnx"
    model = onnx.load(str(original))
    out.original_nodes = len(model.graph.node)
    failure = Failure.from_record(rec)
    job = json.loads((bundle / "cell.json").read_text())
    group = job["groups"][0]
    cell = group["cells"][0]
    feeds = _load_feeds(bundle, failure.shape)
    tolerance = json.loads((bundle / "tolerance.json").read_text()) if (bundle / "tolerance.json").exists() else {}
    parity = rec.get("parity") or {}
    expected = _expected(bundle, failure.shape, model)
    if failure.stage == Stage.PARITY.value and expected is None:
        out.note = "the bundle has no eager outputs (expected.npz): re-run the cell to write them"
        out.failed = True
        return out
    work.mkdir(parents=True, exist_ok=True)
    values = TensorStore(layerwise_values(original, feeds, deadline))
    values.save(work / "values.npz")
    if expected is not None:
        expected.save(work / "expected.npz")
    write_loader(work, feeds)
    spec = CheckSpec(failure, cell["runtime_name"], cell.get("runtime_options") or {},
                     int(job.get("threads") or 1), (group.get("options") or {}).get("precision", "fp32"),
                     str(work / "values.npz"), str(work / "expected.npz") if expected else None,
                     float(parity.get("atol") or tolerance.get("atol") or group.get("atol") or 1e-4),
                     float(parity.get("rtol") or tolerance.get("rtol") or group.get("rtol") or 1e-3),
                     [i.name for i in _graph_inputs(model)])
    spec_path = spec.write(work / "check.json")
    code, why = check_model(original, spec, values, expected)
    if code != SAME:
        out.note = f"the failure does not reproduce on the file alone ({why}): nothing to reduce"
        return out
    fresh_check = [sys.executable, "-m", REDUCE_MODULE, "check", "--spec", str(spec_path),
                   "polygraphy_debug.onnx"]
    best, nodes = original, out.original_nodes
    unfinished: list[str] = []      # passes the budget cut short or left out
    (work / "polygraphy.log").write_text("")
    # Appended to by this process, the servers and each forked pass: every write lands at the end.
    with open(work / "polygraphy.log", "a", encoding="utf-8") as log, \
            CheckServer(spec_path, fresh_check, deadline - time.monotonic(), log) as server, \
            PassHost(work / "values.npz", log, deadline - time.monotonic()) as host:
        check_cmd = server.command or fresh_check
        for direction, mode in PASSES_PLAN:
            if nodes <= 1 or (mode == "linear" and nodes > LINEAR_MAX_NODES):
                continue
            if time.monotonic() >= deadline:
                unfinished.append(f"{direction} {mode}")
                continue
            target = work / f"{direction}-{mode}.onnx"
            if _polygraphy(best, target, direction, mode, check_cmd, work, deadline, log, host):
                best, nodes = target, len(onnx.load(str(target)).graph.node)
            elif time.monotonic() >= deadline:
                unfinished.append(f"{direction} {mode}")
    reduced = onnx.load(str(best))
    if len(reduced.graph.node) >= out.original_nodes:
        out.note = (f"Polygraphy found no smaller failing graph within {timeout_s:g} s "
                    f"(log: {work / 'polygraphy.log'})")
    elif unfinished:
        out.note = (f"the {timeout_s:g} s budget ran out before Polygraphy's {', '.join(unfinished)} "
                    f"pass{'es' if len(unfinished) > 1 else ''} finished: a smaller failing graph may exist "
                    f"(reduce_timeout_s; log: {work / 'polygraphy.log'})")
    reduced_feeds = {i.name: values.values[i.name] for i in _graph_inputs(reduced) if i.name in values.values}
    onnx.save(relax_inputs(reduced, reduced_feeds, set(spec.original_inputs)), str(bundle / "reduced.onnx"))
    np.savez(bundle / "reduced_inputs.npz", **reduced_feeds)
    code, why = check_model(bundle / "reduced.onnx", spec, values, expected)
    out.nodes, out.ops = len(reduced.graph.node), _ops(reduced)
    out.file, out.inputs_file = str(bundle / "reduced.onnx"), str(bundle / "reduced_inputs.npz")
    out.check = why if code == SAME else f"does NOT reproduce the failure: {why}"
    out.seconds = round(time.monotonic() - t0, 1)
    return out


def _ort_tools_without_torch() -> None:
    """Make ``onnxruntime.tools`` importable without its ``__init__``, which imports torch when
    the environment has it (for ``infer_input_info``, a helper Polygraphy never calls). Polygraphy
    infers shapes with ``onnxruntime.tools.symbolic_shape_infer`` (numpy, onnx and sympy), so each
    pass imported torch for nothing: about 3 s of a pass's 5 (profiled). The submodules load from
    the package's own folder as before; where the package is missing nothing is changed."""
    import importlib.util

    if "onnxruntime.tools" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("onnxruntime.tools")
    except ImportError:
        return
    if spec is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)   # the package, its __init__ not run
    sys.modules["onnxruntime.tools"] = package
    import onnxruntime

    onnxruntime.tools = package


def polygraphy_main(values: Path, argv: list[str]) -> int:
    """Polygraphy's command line, with its fallback inference answered from the reference values.

    To cut a graph at an intermediate tensor Polygraphy freezes the other branches to constants,
    computed by running the whole file in ONNX Runtime, which fails for a run failure (that is
    the point of the file). The reference values are those same tensors, computed up to the node
    that fails; Polygraphy's own inference is used only for tensors they do not hold.
    """
    _ort_tools_without_torch()
    from polygraphy.common import TensorMetadata
    from polygraphy.comparator import IterationResult
    from polygraphy.tools import main
    from polygraphy.tools.args.backend.onnx.loader import OnnxInferShapesArgs

    store = TensorStore.load(values)
    own = OnnxInferShapesArgs.fallback_inference

    def fallback_inference(self: Any, onnx_model: Any, outputs: Any = None) -> Any:
        names = list(store.values) if not isinstance(outputs, (list, tuple)) else list(outputs)
        if names and all(n in store.values for n in names):
            chosen = {n: store.values[n] for n in names}
            return IterationResult(chosen, runner_name="harness-reference"), TensorMetadata.from_feed_dict(chosen)
        return own(self, onnx_model, outputs)

    OnnxInferShapesArgs.fallback_inference = fallback_inference
    sys.argv = ["polygraphy", *argv]
    return main()


def env_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REDUCE_MODULE)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="Polygraphy's --check: exit 1 when a graph fails like the cell")
    p.add_argument("--spec", type=Path, required=True)
    p.add_argument("model", type=Path)
    p = sub.add_parser("serve", help="answer checks on a socket, each in a fresh copy of this process")
    p.add_argument("--spec", type=Path, required=True)
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--timeout", type=float, required=True, help="the reduction's budget, seconds")
    p = sub.add_parser("pass-host", help="run Polygraphy passes asked on stdin, each in a fresh copy of this process")
    p.add_argument("--values", type=Path, required=True)
    p = sub.add_parser("reduce", help="reduce one bundle in this environment")
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--record", type=Path, required=True, help="the cell's record (JSON)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--work", type=Path, required=True)
    p = sub.add_parser("polygraphy", help="Polygraphy's command line, fallback inference from reference values")
    p.add_argument("--values", type=Path, required=True)
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "polygraphy":
        return polygraphy_main(args.values, args.args)
    if args.command == "pass-host":
        return host_passes(args.values)
    if args.command == "serve":
        return serve_checks(args.spec, args.socket, args.timeout)
    if args.command == "check":
        code, why = check_model(args.model, CheckSpec.read(args.spec))
        print(why)
        return code
    try:
        result = reduce_bundle(args.bundle, json.loads(args.record.read_text()), args.timeout, args.work)
    except Exception as exc:  # noqa: BLE001 - one line for the runner, the traceback in the log
        import traceback

        traceback.print_exc()
        result = Reduction(note=f"reduction failed: {_short(exc)}", timeout_s=args.timeout, failed=True)
    print("REDUCTION " + json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(env_main())
