"""The stages of a cell inside the worker: export and check once per export group
(``GroupContext``), then load → run → parity → latency per runtime cell (``run_cell``).

In a run, latency is a phase of its own (``Job.phase``): the verdict workers run every stage
but latency and keep each exported file with its feeds in the run's spool (``spool_group``);
once no verdict worker runs any more, a latency worker per environment loads each spooled file
again and times it alone on the machine (``read_spool``, ``time_cell``).

Exceptions become statuses in one place (``stage``); a cell's record is made by
``Record.for_cell``. Standard library at module level; torch, onnx and runtimes lazily.
"""
from __future__ import annotations

import contextlib
import json
import platform
import re
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from harness.core.job import PHASE_VERDICTS, CellJob, ExportGroup, Job
from harness.core.record import Parity, Record
from harness.core.status import Stage, Status


class SecondShapeError(RuntimeError):
    """The graph runs at the example shape but rejects a shape that differs in the dynamic dims."""


class StageFailure(Exception):
    """A stage raised: the cell's verdict (fail, or skip when the runtime cannot run here)."""

    def __init__(self, stage: Stage, exc: BaseException, status: Status = Status.FAIL) -> None:
        super().__init__(f"{stage.value}: {exc}")
        self.stage, self.exc, self.status = stage.value, exc, status


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
    lines = [ln for ln in _ANSI.sub("", str(exc)).strip().splitlines() if ln.strip()]
    return lines[0].strip() if lines else ""


def short_error(exc: BaseException) -> str:
    """'Type: first line', plus the root cause when the outer message is a generic wrapper."""
    text = f"{type(exc).__name__}: {_first_line(exc)}"
    root, seen = exc, {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    if root is not exc and _first_line(root) and _first_line(root) not in text:
        text += f" <- {type(root).__name__}: {_first_line(root)}"
    return text[:500]


@contextlib.contextmanager
def stage(which: Stage, durations: dict[str, float]) -> Iterator[None]:
    """Run one stage: time it into ``durations``; any exception becomes a ``StageFailure``."""
    name = which.value
    t0 = time.perf_counter()
    try:
        yield
    except StageFailure:
        raise
    except Exception as exc:  # the one place where exceptions become statuses
        from harness.runtimes.base import RuntimeUnavailable

        if isinstance(exc, RuntimeUnavailable):
            raise StageFailure(which, exc, Status.SKIP) from exc
        traceback.print_exc()
        raise StageFailure(which, exc) from exc
    finally:
        durations[name] = round(durations.get(name, 0.0) + time.perf_counter() - t0, 6)


def package_versions() -> dict[str, Any]:
    def ver(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import torch

    versions = {"torch": torch.__version__.split("+")[0], "torch_build": torch.__version__,
                "python": platform.python_version()}
    for dist in ("onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt",
                 "numpy", "transformers", "torchvision"):
        v = ver(dist)
        if v:
            versions[dist] = v
    return versions


class GroupContext:
    """What the cells of one export group share: the case, references, the exported file."""

    def __init__(self, job: Job, group: ExportGroup, workdir: Path) -> None:
        self.job, self.group = job, group
        self.durations: dict[str, float] = {}
        self.onnx_path = workdir / f"{group.gid}.onnx"
        self.failure: StageFailure | None = None
        self.spec = None
        self.graph: dict[str, Any] = {}
        self.notes: list[str] = []
        self.feeds: list[dict[str, Any]] = []
        self.references: list[list[Any]] = []

    def prepare(self) -> None:
        import torch

        from harness.run import export as exp
        from harness.run.cases import CaseSkipped, build_case
        from harness.run.parity import flatten_outputs, second_shape_inputs

        g, opts = self.group, self.group.options
        try:
            with stage(Stage.EXPORT, self.durations):
                try:
                    self.spec = build_case(g.case, g.case_ref, Path(self.job.base_dir), g.atol, g.rtol)
                except CaseSkipped as exc:
                    raise StageFailure(Stage.EXPORT, exc, Status.SKIP) from exc
                if self.spec.was_training:
                    self.notes.append("case returned a model in training mode; exported in eval mode")
                dims = self.spec.dynamic_dims if opts.dynamic else {}
                shapes = [self.spec.inputs]
                second = second_shape_inputs(self.spec.inputs, dims)
                if second is not None:
                    shapes.append(second)
                with torch.no_grad():
                    self.references = [flatten_outputs(self.spec.model(*x)) for x in shapes]
                names = exp.input_names(self.spec)
                for x in shapes:
                    ts = [t for t in x if isinstance(t, torch.Tensor)]
                    self.feeds.append({n: t.detach().cpu().numpy() for n, t in zip(names, ts)})
                outputs = exp.output_names(len(self.references[0]))
                exp.export_model(self.spec, g.exporter, g.opset, self.onnx_path,
                                 dynamic=opts.dynamic, constant_folding=opts.constant_folding,
                                 outputs=outputs)
            with stage(Stage.CHECK, self.durations):
                self.graph = exp.graph_facts(self.onnx_path)
                # Names given at export are what deployment code feeds and fetches by: a lost
                # name is a note (the cell still runs by position), not a failure.
                for kind, given in (("input", names), ("output", outputs)):
                    missing = [n for n in given if n not in self.graph[f"{kind}s"]]
                    if missing:
                        self.notes.append(f"{kind} names given at export not in the graph: "
                                          f"{missing} (graph has {self.graph[f'{kind}s']})")
                exp.check_model(self.onnx_path)
        except StageFailure as failure:
            self.failure = failure


def run_cell(ctx: GroupContext, cell: CellJob, versions: dict[str, Any]) -> Record:
    from harness.run.latency import measure, runtime_floor
    from harness.run.parity import compare_outputs
    from harness.runtimes import load_adapter

    job, g = ctx.job, ctx.group
    rec = Record.for_cell(job.run_id, g.key(cell), versions["torch"], job.env, Status.PASS,
                          cell_id=cell.cell_id, versions=dict(versions), graph=ctx.graph,
                          opset_actual=ctx.graph.get("opset"), notes=list(ctx.notes))
    durations = dict(ctx.durations)
    adapter = None
    try:
        if ctx.failure:
            raise ctx.failure
        with stage(Stage.LOAD, durations):
            adapter_cls = load_adapter(cell.runtime_name)
            adapter = adapter_cls(ctx.onnx_path, threads=job.threads, precision=g.options.precision,
                                options=cell.runtime_options)
            # Every shape the cell will run (TensorRT builds its optimisation profile from them).
            adapter.prepare([{n: tuple(v.shape) for n, v in f.items()} for f in ctx.feeds])
            adapter.activate()
            rec.versions["runtime"] = adapter_cls.version()
            graph_inputs = adapter.input_names()
        outputs = []
        with stage(Stage.RUN, durations):
            for i, feeds in enumerate(ctx.feeds):
                use = _match_feeds(feeds, graph_inputs)
                try:
                    outputs.append([_to_numpy(o) for o in adapter.infer(use)])
                except Exception as exc:
                    if i == 0:
                        raise
                    shapes = {n: list(v.shape) for n, v in use.items()}
                    culprits = _culprit_dims(ctx, adapter, graph_inputs)
                    raise SecondShapeError(
                        f"at second shape {shapes}: rejected when growing {', '.join(culprits) or 'all dims together'} "
                        f"(dynamic dims {ctx.spec.dynamic_dims}): {short_error(exc)}") from exc
        with stage(Stage.PARITY, durations):
            parity = Parity(atol=ctx.spec.atol, rtol=ctx.spec.rtol)
            for i, (ref, out) in enumerate(zip(ctx.references, outputs)):
                label = "example shape" if i == 0 else "second shape"
                stats = compare_outputs(ref, out, ctx.spec.atol, ctx.spec.rtol, label)
                rec.notes.extend(stats.pop("notes", []))   # NaN/Inf where eager has them too
                shape = {n: list(v.shape) for n, v in ctx.feeds[i].items()}
                parity.shapes.append({"inputs": shape, **stats})
            parity.max_abs = max(s["max_abs"] for s in parity.shapes)
            parity.max_rel = max(s["max_rel"] for s in parity.shapes)
            rec.parity = parity
        if job.phase != PHASE_VERDICTS:   # in a run's verdict phase, latency comes later
            with stage(Stage.LATENCY, durations):
                if job.latency.enabled:
                    feeds0 = _match_feeds(ctx.feeds[0], graph_inputs)
                    rec.latency_ms = measure(adapter.timed_call(feeds0), job.latency, job.threads)
                    rec.latency_ms.floor_ms = runtime_floor(adapter_cls, job.latency, job.threads)
    except StageFailure as failure:
        rec.status = failure.status
        rec.stage = None if failure.status is Status.SKIP else failure.stage
        rec.error = short_error(failure.exc)
        if failure.status is Status.SKIP:
            rec.reason = str(failure.exc)
    finally:
        if adapter is not None:
            rec.versions.setdefault("runtime", adapter_cls.version())
            rec.options["precision"] = adapter.facts.get("precision", g.options.precision)
            rec.graph = {**rec.graph, "runtime_facts": adapter.facts}
            with contextlib.suppress(Exception):
                adapter.deactivate()
    rec.duration_s = durations
    rec.finished_at = time.time()
    return rec


# -- between the phases: the spool ----------------------------------------------------------------
SPOOL_META = "spool.json"
SPOOL_FEEDS = "feeds.npz"


def spool_group(ctx: GroupContext, torch_version: str) -> None:
    """Keep what the latency phase needs beside the exported file (which the verdict phase
    writes into the group's spool folder): the example-shape feeds, every shape the cells ran
    (TensorRT builds its profile from them) and the torch version."""
    import numpy as np

    folder = ctx.onnx_path.parent
    names = list(ctx.feeds[0])
    np.savez(folder / SPOOL_FEEDS, *[ctx.feeds[0][n] for n in names])
    meta = {"torch": torch_version, "onnx": ctx.onnx_path.name, "inputs": names,
            "shapes": [{n: list(v.shape) for n, v in f.items()} for f in ctx.feeds]}
    (folder / SPOOL_META).write_text(json.dumps(meta))


@dataclass
class Spooled:
    """A group's exported file and feeds, read back by the latency worker."""

    onnx_path: Path
    torch: str = ""
    feeds: dict[str, Any] = field(default_factory=dict)
    shapes: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    error: Exception | None = None     # why the spool cannot be read: the cells fail at latency


def read_spool(job: Job, group: ExportGroup) -> Spooled:
    import numpy as np

    folder = job.spool / group.gid
    try:
        meta = json.loads((folder / SPOOL_META).read_text())
        with np.load(folder / SPOOL_FEEDS) as data:
            arrays = [data[f"arr_{i}"] for i in range(len(meta["inputs"]))]
        return Spooled(folder / meta["onnx"], str(meta["torch"]), dict(zip(meta["inputs"], arrays)),
                       [{n: tuple(d) for n, d in s.items()} for s in meta["shapes"]])
    except Exception as exc:  # noqa: BLE001 - a missing or damaged spool is each cell's failure
        return Spooled(folder / f"{group.gid}.onnx",
                       error=FileNotFoundError(f"spooled export of {group.gid} unreadable: {short_error(exc)}"))


def time_cell(job: Job, group: ExportGroup, cell: CellJob, spooled: Spooled) -> Record:
    """The latency phase of one cell: load its spooled file in the runtime and time it with the
    matrix's protocol. The record carries only the timing (the runner joins it to the verdict);
    a failure here is a failure at ``latency``."""
    from harness.run.latency import measure, runtime_floor
    from harness.runtimes import load_adapter

    rec = Record.for_cell(job.run_id, group.key(cell), spooled.torch or "?", job.env, Status.PASS,
                          cell_id=cell.cell_id)
    durations: dict[str, float] = {}
    adapter = None
    try:
        with stage(Stage.LATENCY, durations):
            if spooled.error is not None:
                raise spooled.error
            adapter_cls = load_adapter(cell.runtime_name)
            adapter = adapter_cls(spooled.onnx_path, threads=job.threads, precision=group.options.precision,
                                  options=cell.runtime_options)
            adapter.prepare(spooled.shapes)
            adapter.activate()
            feeds0 = _match_feeds(spooled.feeds, adapter.input_names())
            rec.latency_ms = measure(adapter.timed_call(feeds0), job.latency, job.threads)
            rec.latency_ms.floor_ms = runtime_floor(adapter_cls, job.latency, job.threads)
    except StageFailure as failure:
        rec.status = Status.FAIL
        rec.stage = Stage.LATENCY.value
        rec.error = short_error(failure.exc)
    finally:
        if adapter is not None:
            with contextlib.suppress(Exception):
                adapter.deactivate()
    rec.duration_s = durations
    rec.finished_at = time.time()
    return rec


def _culprit_dims(ctx: GroupContext, adapter: Any, graph_inputs: list[str]) -> list[str]:
    """Grow one named dynamic dim at a time to say which input and dim the graph rejects."""
    import torch

    from harness.run.export import input_names
    from harness.run.parity import second_shape_inputs

    names = input_names(ctx.spec)
    culprits = []
    for dim_name in sorted({n for dims in ctx.spec.dynamic_dims.values() for n in dims.values()}):
        only = {i: {d: n for d, n in dims.items() if n == dim_name}
                for i, dims in ctx.spec.dynamic_dims.items()}
        grown = second_shape_inputs(ctx.spec.inputs, {i: d for i, d in only.items() if d})
        tensors = [t for t in grown if isinstance(t, torch.Tensor)]
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, tensors)}
        try:
            adapter.infer(_match_feeds(feeds, graph_inputs))
        except Exception:  # noqa: BLE001 - probing which dim the graph rejects
            where = [f"input_{i} dim {d}" for i, dims in only.items() for d in dims]
            culprits.append(f"'{dim_name}' ({', '.join(where)})")
    return culprits


def _match_feeds(feeds: dict[str, Any], graph_inputs: list[str]) -> dict[str, Any]:
    if all(n in feeds for n in graph_inputs):
        return {n: feeds[n] for n in graph_inputs}
    values = list(feeds.values())
    if len(values) == len(graph_inputs):
        return dict(zip(graph_inputs, values))
    missing = [n for n in graph_inputs if n not in feeds]
    raise ValueError(f"graph inputs {graph_inputs} do not match case inputs {list(feeds)}; "
                     f"unknown: {missing}")


def _to_numpy(x: Any):
    import numpy as np

    return np.asarray(x)
