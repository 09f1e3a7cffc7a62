"""Whose bug is it: the blame ladder run on a failing cell, inside the worker.

``diagnose(ctx, cell, rec)`` is called once for a cell whose verdict is ``fail`` (never on a
passing cell: no cost there). It puts a ``Blame`` on the record:

- ``export``: from the exception chain. A guard or constraint violation, a data-dependent
  expression or a specialisation raised from the model's own Python is ``model-code`` (with the
  source line torch names); anything else torch.export or the ONNX translation cannot do is
  ``exporter``.
- ``check``: the ONNX checker rejects the file: ``exporter``.
- ``load`` / ``run`` / ``parity``: the same file, on the same inputs, through the rungs
    1. ``onnx-reference``: ``onnx.reference.ReferenceEvaluator`` (the specification's semantics),
       in a copy of the worker forked for it (a fresh interpreter where the platform cannot
       fork), killed past ``HARNESS_BLAME_REFERENCE_S`` seconds (default 30); a graph too
       large, an operator it lacks or a feature it ignores is ``no-reference``, never a failure;
    2. ``ort-disable-all`` and ``ort-default``: ONNX Runtime CPU with every graph optimisation off
       and at its default level;
    3. ``runtime-fp32``: the cell's runtime at fp32, when the cell runs at a reduced precision;
    4. ``runtime``: the cell's runtime as configured (its own verdict);
  and classified: ``model-code`` when a dim the case declared dynamic was fixed and the model's
  own Python turns a size into a constant (``int(x.shape[1])``, ``.item()``); ``exporter`` when
  the reference disagrees with eager; ``runtime-precision`` when fp32 passes on the same
  runtime; ``runtime-optimizer`` when ONNX Runtime passes with optimisations off only;
  ``runtime-kernel`` when the reference (or, where it cannot judge, ONNX Runtime) agrees with
  eager and the runtime does not; ``unknown`` with why otherwise.

Standard library at module level; numpy, onnx and runtimes lazily. ``python -m
harness.worker.diagnose.blame reference DIR`` is the reference rung's process where there is no fork.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from harness.core.errors import exception_chain
from harness.core.paths import HARNESS_DIR
from harness.core.record import (
    EXPORTER_REPOSITORIES,
    Blame,
    Record,
    runtime_repository,
)
from harness.core.wire import ONNX_REFERENCE_MODULE, REFERENCE_CAP_ENV
from harness.worker.diagnose.onnx_reference import (  # noqa: F401 (REFERENCE_* re-exported for callers)
    REFERENCE_GAPS,
    REFERENCE_MAX_BYTES,
    REFERENCE_MAX_NODES,
    reference_gap,
)
from harness.worker.diagnose.onnx_reference import (
    library_file as _library_file,
)
from harness.worker.diagnose.step_blame import blame_pipeline
from harness.worker.parity import first_difference

REFERENCE_CAP_S = 30.0
# Export failures raised by a guard or constraint of the model's own Python.
_MODEL_GUARD = re.compile(
    r"Constraints violated|ConstraintViolation|GuardOnDataDependentSymNode|Could not guard on "
    r"data-dependent|data-dependent expression|Could not extract specialized integer|"
    r"specialized it to be a constant|marked .* as dynamic but", re.I)
# Export failures of the exporter itself: an operator or decomposition it cannot translate.
_EXPORTER_GAP = re.compile(
    r"UnsupportedOperatorError|No ONNX function found|is not supported|Unsupported|DispatchError|"
    r"ConversionError|not implemented|Exporting the operator|unordered_map::at", re.I)
# A source location as torch prints it in messages.
_LOCATION = re.compile(r'File "([^"]+)", line (\d+)|\(([^()\s]+\.py):(\d+) in \w+\)')
# The model's own Python turning a size into a constant.
# (Branches on a shape are left out: library models have many that fix nothing.)
_SIZE_TO_CONSTANT = re.compile(r"\bint\([^)]*(?:\.shape\b|\.size\()|\.item\(\)|\.tolist\(\)")


def _source_line(path: str, line: int) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()[line - 1].strip()
    except (OSError, IndexError):
        text = ""
    return f"{path}:{line}" + (f": {text}" if text else "")


def model_location(chain: list[BaseException]) -> str | None:
    """The model's source line an export failure names: in torch's message (``File "...", line
    N``, ``(file.py:N in forward)``), else the innermost traceback frame outside torch."""
    for exc in reversed(chain):
        for m in _LOCATION.finditer(str(exc)):
            path, line = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if not _library_file(path):
                return _source_line(path, int(line))
    for exc in reversed(chain):
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
        own = [f for f in frames if not _library_file(f[0])]
        if own:
            return _source_line(*own[-1])
    return None


def blame_export(exc: BaseException, exporter: str) -> Blame:
    chain = exception_chain(exc)
    text = " <- ".join(f"{type(e).__name__}: {e}" for e in chain)
    root = chain[-1]
    root_text = f"{type(root).__name__}: {str(root).strip().splitlines()[0] if str(root).strip() else ''}"
    repo = EXPORTER_REPOSITORIES.get(exporter, "pytorch/pytorch")
    evidence = [{"rung": "export", "outcome": "fails", "detail": root_text[:300]}]
    if _MODEL_GUARD.search(text):
        where = model_location(chain)
        return Blame("model-code", "a guard or constraint raised by the model's own Python stops "
                     "torch.export" + (f" at {where}" if where else ""), None, evidence, source=where)
    if _EXPORTER_GAP.search(text):
        return Blame("exporter", f"the exporter cannot translate an operator or decomposition: {root_text[:200]}",
                     repo, evidence)
    # Raised inside torch's own code while tracing a model that runs in eager: the exporter's.
    where = model_location(chain)
    return Blame("exporter", f"{exporter} export raised inside torch while tracing a model that runs in "
                 f"eager: {root_text[:200]}", repo, evidence, source=where)


# ---- the model's own Python --------------------------------------------------------------------

def size_to_constant_lines(model: Any) -> list[str]:
    """Lines of the model's own ``forward`` methods (not torch's) that turn a size into a Python
    constant: ``int(x.shape[1])``, ``.item()``, ``.tolist()``."""
    found: list[str] = []
    seen: set[Any] = set()
    modules = model.modules() if hasattr(model, "modules") else [model]
    for module in modules:
        fn = getattr(type(module), "forward", None)
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        try:
            path = inspect.getsourcefile(fn) or ""
            lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            continue
        if _library_file(path):
            continue
        for i, line in enumerate(lines):
            code = line.split("#", 1)[0]
            if _SIZE_TO_CONSTANT.search(code):
                found.append(f"{path}:{start + i}: {line.strip()}")
    return found


# ---- the rungs ---------------------------------------------------------------------------------

def _rung(name: str, outcome: str, detail: str = "", seconds: float | None = None) -> dict[str, Any]:
    out = {"rung": name, "outcome": outcome, "detail": detail[:400]}
    if seconds is not None:
        out["seconds"] = round(seconds, 3)
    return out


def _judge(name: str, run_shapes, references, atol, rtol, floors=None) -> dict[str, Any]:
    """Run ``run_shapes()`` (outputs per shape; raises at the shape that fails) and compare."""
    from harness.worker.stages import short_error

    t0 = time.perf_counter()
    try:
        outputs = run_shapes()
    except Exception as exc:  # noqa: BLE001 - a rung's failure is evidence, not the cell's
        return _rung(name, "fails", short_error(exc), time.perf_counter() - t0)
    differs = first_difference(references, outputs, atol, rtol, floors)
    return _rung(name, "differs" if differs else "agrees", differs or "", time.perf_counter() - t0)




def reference_rung(model_path: Path, feeds: list[dict[str, Any]], references, atol, rtol,
                   floors=None) -> dict[str, Any]:
    """The ONNX reference evaluator in a process of its own capped at ``HARNESS_BLAME_REFERENCE_S``."""
    import numpy as np

    t0 = time.perf_counter()
    try:
        gap = reference_gap(model_path)
    except Exception as exc:  # noqa: BLE001 - an unreadable file: the reference cannot judge it
        gap = f"file not readable by onnx: {type(exc).__name__}: {exc}"
    if gap:
        return _rung("onnx-reference", "no-reference", gap, time.perf_counter() - t0)
    cap = float(os.environ.get(REFERENCE_CAP_ENV) or REFERENCE_CAP_S)
    with tempfile.TemporaryDirectory(prefix="harness-reference-") as tmp:
        for i, f in enumerate(feeds):
            np.savez(Path(tmp) / f"feeds_{i}.npz", **f)
        (Path(tmp) / "job.json").write_text(json.dumps({"model": str(model_path), "shapes": len(feeds)}))
        ended = _reference_process(Path(tmp), cap)
        if ended is None:
            return _rung("onnx-reference", "no-reference", f"the reference evaluator ran past {cap:g} s",
                         time.perf_counter() - t0)
        result = json.loads((Path(tmp) / "result.json").read_text()) if (Path(tmp) / "result.json").exists() \
            else {"status": "no-reference", "detail": f"reference subprocess {ended}"}
        if result["status"] != "ran":
            return _rung("onnx-reference", result["status"], result.get("detail", ""), time.perf_counter() - t0)
        outputs = []
        for i in range(result["shapes_run"]):
            with np.load(Path(tmp) / f"outputs_{i}.npz") as data:
                outputs.append([data[f"arr_{k}"] for k in range(len(data.files))])
    seconds = time.perf_counter() - t0
    if result.get("error"):   # the file fails in the reference at a shape eager accepts
        return _rung("onnx-reference", "fails", result["error"], seconds)
    differs = first_difference(references, outputs, atol, rtol, floors)
    return _rung("onnx-reference", "differs" if differs else "agrees", differs or "", seconds)


def _reference_process(folder: Path, cap: float) -> str | None:
    """Run ``_reference_main(folder)`` in a process of its own capped at ``cap`` seconds: a copy
    of this worker forked for it, where the platform forks (onnx and numpy are already imported:
    a fresh interpreter spent about 2.5 s importing them for every failing file), else a fresh
    interpreter. None when it ran past the cap (it is killed); else how it ended, with the tail
    of what it wrote on stderr when it did not end well."""
    from harness.worker import group_process as fresh

    if hasattr(os, "fork"):
        errors = folder / "stderr.txt"

        def child() -> bool:
            fd = os.open(errors, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            _reference_main(folder)
            return True

        status = fresh.in_fresh_copy(child, timeout=cap)
        if status is None:
            return None
        tail = errors.read_text(errors="replace").strip()[-300:] if errors.exists() else ""
        return f"{fresh.describe(status)}: {tail}"
    root = str(HARNESS_DIR.parent)   # the folder holding the harness package this worker runs
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        proc = subprocess.run([sys.executable, "-m", ONNX_REFERENCE_MODULE, "reference", str(folder)], env=env,
                              capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return None
    return f"exited {proc.returncode}: {proc.stderr.strip()[-300:]}"


def _reference_main(folder: Path) -> None:
    """Subprocess side of the reference rung: outputs per shape, or why there is no reference."""
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    job = json.loads((folder / "job.json").read_text())
    result: dict[str, Any] = {"status": "ran", "shapes_run": 0}
    try:
        evaluator = ReferenceEvaluator(onnx.load(job["model"]))
    except Exception as exc:  # noqa: BLE001 - an operator it lacks: no reference
        result = {"status": "no-reference", "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        (folder / "result.json").write_text(json.dumps(result))
        return
    names = list(evaluator.input_names)
    for i in range(job["shapes"]):
        with np.load(folder / f"feeds_{i}.npz") as data:
            feeds = {k: data[k] for k in data.files}
        if not all(n in feeds for n in names) and len(feeds) == len(names):
            feeds = dict(zip(names, feeds.values()))
        try:
            outs = evaluator.run(None, feeds)
        except (NotImplementedError, KeyError) as exc:
            result = {"status": "no-reference", "detail": f"{type(exc).__name__}: {str(exc)[:300]}"}
            break
        except Exception as exc:  # noqa: BLE001 - the file fails where eager did not
            label = "example shape" if i == 0 else "second shape"
            result["error"] = f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            break
        np.savez(folder / f"outputs_{i}.npz", *[np.asarray(o) for o in outs])
        result["shapes_run"] = i + 1
    (folder / "result.json").write_text(json.dumps(result))


def _ort_rung(name: str, model_path: Path, level: str, feeds, references, atol, rtol, threads,
              floors=None) -> dict[str, Any]:
    from harness.runtimes.base import LoadOptions, match_feeds
    from harness.runtimes.ort_cpu import OrtCpuAdapter

    if why := OrtCpuAdapter.unavailable_reason():
        return _rung(name, "unavailable", why)

    def run_shapes():
        load = LoadOptions(graph_optimizations=level != "ORT_DISABLE_ALL")
        with OrtCpuAdapter(model_path, threads=threads, load=load) as adapter:
            names = adapter.input_names()
            return [[__import__("numpy").asarray(o) for o in adapter.infer(match_feeds(f, names))] for f in feeds]

    return _judge(name, run_shapes, references, atol, rtol, floors)


def _runtime_rung(name: str, cell: Any, ctx: Any, precision: str, feeds, references, atol, rtol,
                  floors=None) -> dict[str, Any]:
    from harness.runtimes import load_adapter
    from harness.runtimes.base import match_feeds

    def run_shapes():
        adapter = load_adapter(cell.runtime_name)(ctx.onnx_path, threads=ctx.job.threads, precision=precision,
                                                  options=cell.runtime_options)
        adapter.prepare([{n: tuple(v.shape) for n, v in f.items()} for f in feeds])
        with adapter:
            names = adapter.input_names()
            return [[__import__("numpy").asarray(o) for o in adapter.infer(match_feeds(f, names))] for f in feeds]

    return _judge(name, run_shapes, references, atol, rtol, floors)


# ---- classification ----------------------------------------------------------------------------

def _second_shape_failure(rec: Record) -> bool:
    return "second shape" in (rec.error or "")


def classify(rec: Record, rungs: list[dict[str, Any]], specialised: list[dict[str, Any]],
             size_lines: list[str], reduced: bool) -> Blame:
    """The party from the rungs' outcomes (pure: unit-tested on outcomes)."""
    by = {r["rung"]: r for r in rungs}
    ref = by.get("onnx-reference", {}).get("outcome")
    ort0 = by.get("ort-disable-all", {}).get("outcome")
    ort1 = by.get("ort-default", {}).get("outcome")
    fp32 = by.get("runtime-fp32", {}).get("outcome")
    runtime_repo = runtime_repository(rec.runtime)
    exporter_repo = EXPORTER_REPOSITORIES.get(rec.exporter, "pytorch/pytorch")
    is_ort = rec.runtime.startswith("ort")
    file_wrong = ref in ("differs", "fails")
    if specialised and _second_shape_failure(rec) or (file_wrong and size_lines and _second_shape_failure(rec)):
        fixed = "; ".join(s["note"] for s in specialised) or "the file only works at the example shape"
        if size_lines:
            return Blame("model-code", f"{fixed}: the model's own Python turns a size into a constant "
                         f"({size_lines[0].split(': ', 1)[-1]})", None, rungs, source=size_lines[0])
        return Blame("exporter", f"{fixed}, and the model's code has no size-to-constant conversion: "
                     "the exporter fixed the dim", exporter_repo, rungs)
    if reduced and fp32 == "agrees":
        return Blame("runtime-precision", f"{rec.runtime} fails at {rec.options.get('precision')} and agrees "
                     "with eager at fp32", runtime_repo, rungs)
    if file_wrong:
        how = "disagrees with eager" if ref == "differs" else "rejects inputs eager accepts"
        return Blame("exporter", f"the ONNX reference evaluator {how}: the file does not compute what the "
                     f"model does ({by['onnx-reference']['detail'][:160]})", exporter_repo, rungs)
    witness = "the ONNX reference evaluator agrees with eager on the same file and inputs" if ref == "agrees" else None
    if witness is None and ort0 == "agrees" and not is_ort:
        both = " and at its default level" if ort1 == "agrees" else ""
        witness = (f"ONNX Runtime agrees with eager on the same file and inputs with optimisations off{both}; "
                   f"the reference cannot judge ({by.get('onnx-reference', {}).get('detail', '')[:200]})")
    if is_ort:
        if ort0 == "agrees" and ort1 in ("differs", "fails"):
            return Blame("runtime-optimizer", "ONNX Runtime agrees with eager with every graph optimisation "
                         "off (ORT_DISABLE_ALL) and fails at its default level", runtime_repo, rungs)
        if ref == "agrees":
            return Blame("runtime-kernel", "the ONNX reference evaluator agrees with eager and ONNX Runtime "
                         "does not, with optimisations on and off", runtime_repo, rungs)
        if ort0 == "agrees" and ort1 == "agrees":
            return Blame("unknown", "ONNX Runtime agrees with eager when re-run: the failure does not "
                         "reproduce outside the cell", None, rungs)
        return Blame("unknown", "no reference to judge by "
                     f"({by.get('onnx-reference', {}).get('detail', '')[:160]}) and ONNX Runtime fails at "
                     "every level", None, rungs)
    if witness is not None:
        return Blame("runtime-kernel", f"{rec.runtime} fails where {witness}", runtime_repo, rungs)
    return Blame("unknown", f"neither the reference ({ref}) nor ONNX Runtime ({ort0}) agrees with eager: "
                 "cannot tell the file from the runtimes", None, rungs)


def specialisation_blame(rec: Record, graph: dict[str, Any], rungs: list[dict[str, Any]],
                         size_lines: list[str] = ()) -> Blame | None:
    """A failure at the second shape whose cause torch itself named while exporting: a dim it
    fixed to one value (``graph.export_specialised``: the silent re-export or the error, with the
    model's line, else the model's own size-to-constant line), or an example size of 0 or 1 the
    file fixed. Both are the case's own doing (its code or its example), with the remedy that
    fits; a fact with neither a line nor a 0/1 example is left to ``classify``."""
    if not _second_shape_failure(rec):
        return None
    for fact in graph.get("export_specialised") or []:
        zero_one = fact.get("value") in (0, 1) and fact.get("example") == fact.get("value")
        source = fact.get("source") or (size_lines[0] if size_lines and not zero_one else None)
        if source is None and not zero_one:
            continue
        at = f" at {source}" if source else ""
        return Blame("model-code", f"torch.export fixed {fact['dim']} to {fact['value']}{at} ({fact['how']}); "
                     f"{fact['remedy']}", None, rungs, source=source)
    for fact in graph.get("specialised") or []:
        if fact.get("value") in (0, 1) and fact.get("example") == fact.get("value"):
            return Blame("model-code", f"{fact['note']}: the example's size {fact['value']}, which torch.export "
                         f"specialises; give an example with {fact['dim']} >= 2", None, rungs)
    return None


def _shared_rungs(ctx: Any, feeds, references, atol, rtol, floors=None) -> list[dict[str, Any]]:
    """The rungs that depend on the file only (reference, ONNX Runtime), run once per export
    group: every runtime cell of a group shares its file and inputs."""
    stat = ctx.onnx_path.stat()
    key = (str(ctx.onnx_path), stat.st_mtime_ns, stat.st_size)
    cached = getattr(ctx, "_blame_rungs", None)
    if cached is not None and cached[0] == key:
        return [{**r, "shared": True} for r in cached[1]]
    rungs = [reference_rung(ctx.onnx_path, feeds, references, atol, rtol, floors),
             _ort_rung("ort-disable-all", ctx.onnx_path, "ORT_DISABLE_ALL", feeds, references, atol, rtol,
                       ctx.job.threads, floors),
             _ort_rung("ort-default", ctx.onnx_path, "ORT_ENABLE_ALL", feeds, references, atol, rtol,
                       ctx.job.threads, floors)]
    ctx._blame_rungs = (key, rungs)
    return rungs


def diagnose(ctx: Any, cell: Any, rec: Record) -> None:
    """The hook: put a blame on a failing cell's record (never raises; costs nothing otherwise)."""
    from harness.core.status import Status

    if rec.status is not Status.FAIL or rec.stage in (None, "latency"):
        return
    t0 = time.perf_counter()
    try:
        rec.blame = _diagnose(ctx, cell, rec)
    except Exception as exc:  # noqa: BLE001 - a diagnosis never changes the verdict
        why = f"the blame ladder itself failed: {type(exc).__name__}: {exc}"[:300]
        rec.blame = Blame("unknown", why)
        rec.pass_not_run("blame", why)   # said in run.json and the reports, not only here
    else:
        layer_blame(ctx, cell, rec)
    rec.blame.seconds = round(time.perf_counter() - t0, 3)
    rec.duration_s = {**rec.duration_s, "blame": rec.blame.seconds}


def layer_blame(ctx: Any, cell: Any, rec: Record) -> None:
    """The layer of the stack on the ladder's blame (``harness.worker.diagnose.layers``); its own
    failure leaves the ladder's party and says so."""
    from harness.worker.diagnose.layers import refine

    t0 = time.perf_counter()
    try:
        refine(ctx, cell, rec, rec.blame)
    except Exception as exc:  # noqa: BLE001 - a diagnosis never changes the verdict
        traceback.print_exc()
        rec.blame.layer, rec.blame.kind = "undetermined", "undetermined"
        rec.blame.experiments.append({"experiment": "layer", "outcome": "not run",
                                      "detail": f"{type(exc).__name__}: {exc}"[:300]})
    rec.duration_s = {**rec.duration_s, "layer": round(time.perf_counter() - t0, 3)}


def _diagnose(ctx: Any, cell: Any, rec: Record) -> Blame:
    failure = getattr(ctx, "failure", None)
    if rec.stage == "reference":
        return Blame("model-code", "the case fails in torch eager at its example inputs: nothing was exported",
                     None, [_rung("reference", "fails", rec.error or "")],
                     source=model_location(exception_chain(failure.exc)) if failure is not None else None)
    if rec.stage == "export":
        if failure is None:
            return Blame("unknown", "the export failure's exception is not at hand")
        blame = blame_export(failure.exc, rec.exporter)
        # torch named the dim it fixed while tracing, and the model's line on the stack then
        fact = next((f for f in getattr(ctx, "export_facts", []) or [] if f.get("source")), None)
        if fact is not None and blame.party == "model-code":
            blame.source = fact["source"]
            blame.reason = (f"torch.export fixed {fact['dim']} to {fact['value']} at {fact['source']}: "
                            f"{fact['remedy']}")
        return blame
    if (step := blame_pipeline(rec)) is not None:   # a post-export step's library
        return step
    if rec.stage == "check":
        return Blame("exporter", f"the ONNX checker rejects the exported file: {rec.error or ''}"[:300],
                     EXPORTER_REPOSITORIES.get(rec.exporter, "pytorch/pytorch"),
                     [_rung("onnx-checker", "fails", rec.error or "")])
    judge = getattr(ctx.group, "judge", None) or {}   # a pipeline's file: judged as its cell is
    atol, rtol = judge.get("atol", ctx.spec.atol), judge.get("rtol", ctx.spec.rtol)
    feeds, references = ctx.feeds, ctx.references
    # Every fp32 rung is judged as the cell is: atol / rtol and the model's own noise.
    floors_of = getattr(ctx, "floors", None)
    floors = [floors_of(i) for i in range(len(references))] if floors_of is not None else None
    rungs = [dict(r) for r in _shared_rungs(ctx, feeds, references, atol, rtol, floors)]
    precision = str(rec.options.get("precision") or ctx.group.options.precision or "fp32")
    reduced = precision != "fp32"
    if reduced:
        rungs.append(_runtime_rung("runtime-fp32", cell, ctx, "fp32", feeds, references, atol, rtol, floors))
    rungs.append(_rung("runtime", "fails" if rec.stage in ("load", "run") else "differs",
                       f"{rec.runtime} ({precision}): {rec.error or ''}"))
    graph = rec.graph or getattr(ctx, "graph", None) or {}   # the cell's own facts (confirmed dims)
    size_lines = size_to_constant_lines(ctx.spec.model)
    blame = specialisation_blame(rec, graph, rungs, size_lines) or classify(
        rec, rungs, list(graph.get("specialised") or []), size_lines, reduced)
    if blame.party == "exporter" and rec.stage == "parity":
        from harness.worker.diagnose.divergence import first_divergence

        blame.divergence = first_divergence(ctx, rec)
    return blame


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "reference":
        _reference_main(Path(args[1]))
        return 0
    print("usage: python -m harness.worker.diagnose.blame reference DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
