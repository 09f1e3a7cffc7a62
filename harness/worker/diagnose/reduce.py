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
                deadline: float, log: Any) -> bool:
    """One `polygraphy debug reduce` pass ('outputs': earliest failing outputs; 'inputs': latest
    failing inputs); False when it did not finish in time or failed."""
    cmd = [sys.executable, "-m", REDUCE_MODULE, "polygraphy", "--values", str(work / "values.npz"),
           "debug", "reduce", str(model), "-o", str(output), "--mode", mode,
           "--no-reduce-inputs" if direction == "outputs" else "--no-reduce-outputs",
           "--data-loader-script", f"{work / 'loader.py'}:load_data",
           "--fail-code", str(SAME), "--check", *check_cmd]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.write(f"\n(reduce pass over {direction} stopped: time budget spent)\n")
        return False
    return proc.returncode == 0 and output.exists()


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
    np.savez(work / "feeds.npz", **feeds)
    (work / "loader.py").write_text(
        "import numpy as np\n\n\ndef load_data():\n"
        f"    with np.load({str(work / 'feeds.npz')!r}) as data:\n"
        "        yield {k: data[k] for k in data.files}\n")
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
    check_cmd = [sys.executable, "-m", REDUCE_MODULE, "check", "--spec", str(spec_path),
                 "polygraphy_debug.onnx"]
    best, nodes = original, out.original_nodes
    unfinished: list[str] = []      # passes the budget cut short or left out
    with open(work / "polygraphy.log", "w", encoding="utf-8") as log:
        for direction, mode in PASSES_PLAN:
            if nodes <= 1 or (mode == "linear" and nodes > LINEAR_MAX_NODES):
                continue
            if time.monotonic() >= deadline:
                unfinished.append(f"{direction} {mode}")
                continue
            target = work / f"{direction}-{mode}.onnx"
            if _polygraphy(best, target, direction, mode, check_cmd, work, deadline, log):
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


def polygraphy_main(values: Path, argv: list[str]) -> int:
    """Polygraphy's command line, with its fallback inference answered from the reference values.

    To cut a graph at an intermediate tensor Polygraphy freezes the other branches to constants,
    computed by running the whole file in ONNX Runtime, which fails for a run failure (that is
    the point of the file). The reference values are those same tensors, computed up to the node
    that fails; Polygraphy's own inference is used only for tensors they do not hold.
    """
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
