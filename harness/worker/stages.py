"""The stages of a cell inside the worker: reference (case built, eager outputs), export and
check once per export group (``GroupContext``), then load → run → parity → latency per runtime
cell (``run_cell``).

In a run, latency is a phase of its own (``Job.phase``): the verdict workers run every stage
but latency and keep each exported file with its feeds in the run's spool (``spool_group``);
once no verdict worker runs any more, a latency worker per environment loads each spooled file
again and times it alone on the machine (``harness.worker.spool``, ``time_cell``).

Exceptions become statuses in one place (``stage``); a cell's record is made by
``Record.for_cell``. Standard library at module level; torch, onnx and runtimes lazily.
"""
from __future__ import annotations

import contextlib
import platform
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

from harness.core.errors import short_error
from harness.core.job import PHASE_VERDICTS, CellJob, ExportGroup, Job
from harness.core.record import Parity, Record
from harness.core.status import Stage, Status
from harness.runtimes.base import match_feeds
from harness.worker.dims import note_specialised
from harness.worker.export_log import ExportLog
from harness.worker.inputs import dims_by_name
from harness.worker.spool import SpooledFile, write_spool


class SecondShapeError(RuntimeError):
    """The graph runs at the example shape but rejects a shape that differs in the dynamic dims."""


class OwnError(RuntimeError):
    """The matrix's own code failed on a cell (preparing its inputs, reading its outputs): the
    cell's status is ``error``, never a verdict on the model."""


# What an ``error`` record says besides its error (``Record.reason``).
OWN_ERROR_REASON = ("this is the matrix's fault, not the model's: the project's own code failed on "
                    "this cell (the traceback is in the cell's log); report it to the project")


class StageFailure(Exception):
    """A stage raised: the cell's verdict (fail, or skip when the runtime cannot run here)."""

    def __init__(self, stage: Stage, exc: BaseException, status: Status = Status.FAIL) -> None:
        super().__init__(f"{stage.value}: {exc}")
        self.stage, self.exc, self.status = Stage(stage), exc, status


# Called as each stage begins (the worker sends it to the runner, which charges a process that
# dies before the cell's record to the stage it was in).
on_stage_start: Callable[[Stage], None] | None = None


@contextlib.contextmanager
def stage(which: Stage, durations: dict[str, float]) -> Iterator[None]:
    """Run one stage: time it into ``durations``; any exception becomes a ``StageFailure``."""
    name = which.value
    if on_stage_start is not None:
        on_stage_start(which)
    t0 = time.perf_counter()
    try:
        yield
    except StageFailure:
        raise
    except Exception as exc:  # the one place where exceptions become statuses
        from harness.runtimes.base import RuntimeUnavailable
        from harness.worker.cases import CaseSkipped

        if isinstance(exc, (RuntimeUnavailable, CaseSkipped)):
            raise StageFailure(which, exc, Status.SKIP) from exc
        traceback.print_exc()
        if isinstance(exc, OwnError):
            raise StageFailure(which, exc, Status.ERROR) from exc
        raise StageFailure(which, exc) from exc
    finally:
        durations[name] = round(durations.get(name, 0.0) + time.perf_counter() - t0, 6)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of the children it has waited for."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def clocked(into: dict[str, float]) -> Iterator[None]:
    """Add the block's wall and CPU seconds to ``into`` ("wall_s", "cpu_s")."""
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    try:
        yield
    finally:
        into["wall_s"] = into.get("wall_s", 0.0) + time.perf_counter() - wall0
        into["cpu_s"] = into.get("cpu_s", 0.0) + cpu_seconds() - cpu0


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
                 "numpy", "transformers", "torchvision", "timm", "optimum", "optimum-onnx"):
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
        self.shapes: list[Any] = []                  # CaseInputs: the example, then the second
        self.feeds: list[dict[str, Any]] = []
        self.references: list[list[Any]] = []
        self.output_paths: list[tuple] = []
        self.second_shape: dict[str, Any] | None = None   # how the second shape was checked
        self.noise: dict[str, Any] | None = None          # the model's own float32 noise (run.noise)
        self.export_facts: list[dict[str, Any]] = []      # dims torch fixed while exporting (export_log)
        self.pinned: list[dict[str, Any]] = []            # dims only the exported program pins
        self.dim_marking: str | None = None
        self.program: Any = None
        self.clock: dict[str, float] = {}            # wall and CPU seconds of the shared stages

    @property
    def dims(self) -> dict:
        return self.spec.dynamic_dims if self.spec is not None and self.group.options.dynamic else {}

    def prepare(self) -> None:
        with clocked(self.clock):
            again = self._export_in_a_copy() if self.job.determinism else None
            self._prepare()
        if again is not None:
            self._compare_exports(again)

    def _export_in_a_copy(self) -> Path | None:
        """``determinism``: the same export first in a fresh copy of this process (forked before
        this one builds anything), into a file of its own; None when that copy failed."""
        from harness.worker import group_process as fresh

        again = self.onnx_path.with_name(self.onnx_path.stem + ".again.onnx")

        def export_again() -> bool:
            global on_stage_start
            on_stage_start = None          # the copy sends no events
            copy = GroupContext(self.job, self.group, again.parent)
            copy.onnx_path = again
            copy._prepare()
            return copy.failure is None
        print("=== determinism: the same export in a fresh process ===", flush=True)
        status = fresh.in_fresh_copy(export_again)
        return again if status == 0 and again.exists() else None

    def _compare_exports(self, again: Path) -> None:
        from harness.worker.determinism import compare_exports

        if self.failure is None:
            try:
                result = compare_exports(again, self.onnx_path)
            except Exception as exc:  # noqa: BLE001 - a fact that could not be taken
                result = {"identical": None, "error": short_error(exc)}
            self.graph["determinism"] = result
            if result.get("identical") is False:
                self.notes.append("the export is not deterministic: two fresh processes exported files "
                                  f"that differ in {', '.join(result['differs'])}")
        for p in again.parent.glob(again.name + "*"):
            p.unlink()

    def _prepare(self) -> None:
        from harness.worker import export as exp
        from harness.worker.cases import CaseSkipped, build_case
        from harness.worker.outputs import output_names

        g, opts = self.group, self.group.options
        try:
            with stage(Stage.REFERENCE, self.durations):
                try:
                    self.spec = build_case(g.case, g.case_ref, Path(self.job.base_dir), g.atol, g.rtol)
                except CaseSkipped as exc:
                    raise StageFailure(Stage.REFERENCE, exc, Status.SKIP) from exc
                if self.spec.was_training:
                    self.notes.append("case returned a model in training mode; exported in eval mode")
                self._references()
            names = self.spec.example.input_names()
            outputs = output_names(self.output_paths)
            named = getattr(self.spec.model, "onnx_output_names", None)   # the case names them
            if named and len(named) == len(outputs):
                outputs = list(named)
            log = ExportLog()
            try:
                with stage(Stage.EXPORT, self.durations):
                    self.dim_marking, program, facts = exp.export_model(
                        self.spec, g.exporter, g.opset, self.onnx_path, dynamic=opts.dynamic,
                        constant_folding=opts.constant_folding, outputs=outputs, dim_policy=opts.dim_policy,
                        log=log)
                    self.program = program   # torch.onnx's ONNXProgram (dynamo): node values for a blame
            except StageFailure as failure:
                self._note_export_log(log, failure.exc)
                raise
            self._note_export_log(log, None)
            with stage(Stage.CHECK, self.durations):
                self.graph = {**exp.graph_facts(self.onnx_path), **(facts or {}), **self.graph}
                self._note_dims(names, program)
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

    def _note_export_log(self, log: Any, failure: BaseException | None) -> None:
        """What torch said while exporting (``harness.worker.export_log``): a dim it fixed to one
        value, by a silent re-export with its suggested fix or in the error that ended the export,
        with the model's source line and the remedy that fits; kept in ``graph.export_specialised``."""
        try:
            self.export_facts = log.facts(self.spec.example, self.dims, failure)
        except Exception:  # noqa: BLE001 - a diagnosis; never changes the verdict
            traceback.print_exc()
            return
        for f in self.export_facts:
            at = f" at {f['source']}" if f.get("source") else ""
            if f["how"] == "re-exported":
                self.notes.append(f"torch.onnx exported the model again with torch.export's suggested fix: "
                                  f"{f['dim']} was inferred to be a constant ({f['value']}){at}, so the file "
                                  f"fixes {f['dim']} to {f['value']} ({f['input']} dim {f['axis']}); "
                                  f"remedy: {f['remedy']}")
            else:
                self.notes.append(f"torch.export specialised {f['dim']} to {f['value']}{at} ({f['input']} dim "
                                  f"{f['axis']}); remedy: {f['remedy']}")
        if self.export_facts:
            self.graph["export_specialised"] = self.export_facts

    def _note_dims(self, names: list[str], program: Any) -> None:
        """Dims the case declared dynamic that the file fixes (certain: a number in the file),
        those only the exported program pins (candidates for the second shape to confirm), names
        that are digits, and the 0/1 specialisation where it fixed a dim."""
        from harness.worker.dims import digit_symbols
        from harness.worker.second_shape import zero_one_note

        by_name = dims_by_name(self.dims, self.spec.example)
        notes, self.pinned = note_specialised(self.graph, by_name, names, program)
        self.notes += notes + digit_symbols(by_name, self.graph)
        explained = {f["dim"] for f in self.export_facts}
        sizes = {n: int(self.spec.example.node(k).shape[d]) for k, ds in self.dims.items() for d, n in ds.items()}
        for f in [*self.graph.get("specialised", []), *self.pinned]:
            f["example"] = sizes.get(f["dim"])
        for f in self.graph.get("specialised", []):
            if (self.group.exporter == "dynamo" and f["dim"] not in explained and f["value"] in (0, 1)
                    and sizes.get(f["dim"]) == f["value"]):
                explained.add(f["dim"])
                self.notes.append(zero_one_note(f["dim"], f["value"], f"fixed it to {f['value']} in the file"))

    def _references(self) -> None:
        """Eager outputs at the example inputs (a failure fails the cell at ``reference``) and at
        the second shape: the case's own ``second_inputs``, else inputs grown in every dynamic
        dim. Eager rejecting the second shape is a note, and the cell is checked at the example
        shape only. What the matrix's own code does here (reading outputs, growing inputs,
        taking feeds) raises ``OwnError`` when it fails: the cell is an ``error``, not the model's
        failure. Last, the model's own float32 noise at each shape (``harness.worker.noise``)."""
        import torch

        from harness.worker.outputs import output_leaves
        from harness.worker.parity import second_shape_inputs

        spec = self.spec
        with torch.no_grad():
            outputs = spec.example.call(spec.model)
        leaves = _own("reading the model's outputs", output_leaves, outputs)
        self.output_paths = [p for p, _ in leaves]
        self.shapes, self.references = [spec.example], [[a for _, a in leaves]]
        second, source = _own("generating the second-shape inputs from the example",
                              self._second_inputs, second_shape_inputs)
        if second is not None:
            refused: Exception | None = None
            try:
                with torch.no_grad():
                    outputs = second.call(spec.model)
            except Exception as exc:  # noqa: BLE001 - the model's own verdict on those inputs
                refused = exc
            if refused is None:
                self.references.append([a for _, a in _own("reading the model's outputs", output_leaves, outputs)])
                self.shapes.append(second)
                self.second_shape = {"checked": True, "source": source}
            else:
                traceback.print_exception(refused)
                reason = f"eager-rejects-{source}-second-shape"
                shapes = {n: list(v.shape) for n, v in _own("taking the inputs' feeds", second.feeds).items()}
                self.second_shape = {"checked": False, "source": source, "reason": reason,
                                     "error": short_error(refused)}
                self.notes.append(f"second shape not checked ({reason}): torch eager rejects the "
                                  f"{source} inputs {shapes}: {short_error(refused)}; the verdict is "
                                  "for the example shape only")
        self.feeds = _own("taking the inputs' feeds", lambda: [s.feeds() for s in self.shapes])
        self._measure_noise()

    def _measure_noise(self) -> None:
        """The model's own float32 noise per shape and output (``harness.worker.noise``). A model it
        cannot be measured on is judged by atol / rtol alone, with the reason kept."""
        from harness.worker import noise

        try:
            self.noise = noise.measure(self.spec.model, self.shapes, self.references)
        except Exception as exc:  # noqa: BLE001 - a fact not taken; the verdict does not need it
            traceback.print_exc()
            self.noise = {"method": None, "error": short_error(exc)}

    def floors(self, shape: int) -> list[float | None] | None:
        """The noise floors of one shape's outputs, None where none was measured."""
        floors = (self.noise or {}).get("floors") or []
        return floors[shape] if shape < len(floors) else None

    def _second_inputs(self, grow) -> tuple[Any, str]:
        spec = self.spec
        if spec.second is not None:
            same = [v.shape for v in spec.second.feeds().values()] == \
                [v.shape for v in spec.example.feeds().values()]
            # at another shape only where the graph has dynamic dims; other values at the same
            # shape always (a branch or a value frozen at export shows there)
            if self.dims or same:
                return spec.second, "case"
        if self.dims:
            return grow(spec.example, self.dims), "generated"
        return None, ""


def _own(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, where a failure is the matrix's own (``OwnError``), never the model's."""
    try:
        return fn(*args)
    except Exception as exc:
        raise OwnError(f"the matrix's own code failed {what}: {short_error(exc)}") from exc


def run_cell(ctx: GroupContext, cell: CellJob, versions: dict[str, Any]) -> Record:
    job, g = ctx.job, ctx.group
    rec = Record.for_cell(job.run_id, g.key(cell), versions["torch"], job.env, Status.PASS,
                          cell_id=cell.cell_id, versions=dict(versions), graph=ctx.graph,
                          opset_actual=ctx.graph.get("opset"), notes=list(ctx.notes))
    if ctx.dim_marking:
        # How dynamic dims reached the exporter (not part of the cell's identity).
        rec.options["dim_marking"] = ctx.dim_marking
    durations = dict(ctx.durations)
    clock = dict(ctx.clock)
    with clocked(clock):
        _run_stages(ctx, cell, rec, durations)
    rec.wall_s, rec.cpu_s = round(clock["wall_s"], 3), round(clock["cpu_s"], 3)
    if g.exporter == "optimum":
        from harness.worker.export_optimum import note_disagreement

        note_disagreement(rec)
    rec.duration_s = durations
    rec.finished_at = time.time()
    return rec


def _run_stages(ctx: GroupContext, cell: CellJob, rec: Record, durations: dict[str, float]) -> None:
    from harness.runtimes import load_adapter
    from harness.worker.latency import measure, runtime_floor
    from harness.worker.noise import summary as noise_summary
    from harness.worker.parity import ParityError, compare_outputs

    job, g = ctx.job, ctx.group
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
                use = match_feeds(feeds, graph_inputs)
                try:
                    outputs.append([_to_numpy(o) for o in adapter.infer(use)])
                except Exception as exc:
                    if i == 0:
                        raise
                    outcomes = _probe_dims(ctx, rec, adapter, graph_inputs, judge=False)
                    raise _second_shape_error(ctx, use, exc, outcomes) from exc
        with stage(Stage.PARITY, durations):
            # Every shape is compared, and its numbers kept, also when one fails: the record
            # of a parity failure says by how much, where, per output and per shape.
            parity = Parity(atol=ctx.spec.atol, rtol=ctx.spec.rtol)
            rec.parity = parity
            if ctx.second_shape:
                parity.extra["second_shape"] = dict(ctx.second_shape)
            failed: ParityError | None = None
            # The model's own noise is judged at fp32 only (a reduced precision is its own budget).
            judged = g.options.precision == "fp32"
            for i, (ref, out) in enumerate(zip(ctx.references, outputs)):
                label = "example shape" if i == 0 else "second shape"
                try:
                    stats = compare_outputs(ref, out, ctx.spec.atol, ctx.spec.rtol, label,
                                            ctx.floors(i) if judged else None)
                except ParityError as exc:
                    stats, failed = {**exc.stats, "failed": True}, failed or exc
                rec.notes.extend(stats.pop("notes", []))   # NaN/Inf where eager has them too
                shape = {n: list(v.shape) for n, v in ctx.feeds[i].items()}
                parity.shapes.append({"inputs": shape, **stats})
            for k in ("max_abs", "max_rel"):
                found = [s[k] for s in parity.shapes if s.get(k) is not None]
                setattr(parity, k, max(found) if found else None)
            parity.noise = noise_summary(ctx.noise, parity.shapes, judged)
            if failed is not None and len(parity.shapes) > 1 and not parity.shapes[0].get("failed"):
                from harness.worker.second_shape import culprit_text

                # Right at the example, wrong at the second shape: which dim, grown alone, does it.
                outcomes = _probe_dims(ctx, rec, adapter, graph_inputs, judge=True)
                culprits = culprit_text(ctx, outcomes)
                if culprits:
                    failed = ParityError(f"{failed} (differs when growing {', '.join(culprits)} alone)",
                                         failed.stats)
            if failed is not None:
                raise failed
        if job.phase != PHASE_VERDICTS:   # in a run's verdict phase, latency comes later
            with stage(Stage.LATENCY, durations):
                if job.latency.enabled:
                    feeds0 = match_feeds(ctx.feeds[0], graph_inputs)
                    rec.latency_ms = measure(adapter.timed_call(feeds0), job.latency, job.threads)
                    rec.latency_ms.floor_ms = runtime_floor(adapter_cls, job.latency, job.threads)
    except StageFailure as failure:
        rec.status = failure.status
        rec.stage = None if failure.status is Status.SKIP else failure.stage
        rec.error = short_error(failure.exc)
        if failure.status is Status.SKIP:
            rec.reason = str(failure.exc)
        elif failure.status is Status.ERROR:
            rec.reason = OWN_ERROR_REASON
    finally:
        if adapter is not None:
            rec.versions.setdefault("runtime", adapter_cls.version())
            rec.options["precision"] = adapter.facts.get("precision", g.options.precision)
            rec.notes.extend(adapter.facts.get("notes", []))   # what the runtime says of the run
            rec.graph = {**rec.graph, "runtime_facts": adapter.facts}
            with contextlib.suppress(Exception):
                adapter.deactivate()


def _probe_dims(ctx: GroupContext, rec: Record, adapter: Any, graph_inputs: list[str],
                judge: bool) -> dict[str, str]:
    """Each generated dynamic dim grown alone (``harness.worker.second_shape``), and what that
    confirms on the record; nothing for the case's own second inputs."""
    from harness.worker.second_shape import dim_outcomes, explain

    if not ctx.dims or (ctx.second_shape or {}).get("source") == "case":
        return {}
    outcomes = dim_outcomes(ctx, adapter, graph_inputs, judge)
    explain(ctx, rec, outcomes)
    return outcomes


def _second_shape_error(ctx: GroupContext, feeds: dict[str, Any], exc: Exception,
                        outcomes: dict[str, str]) -> SecondShapeError:
    from harness.worker.second_shape import culprit_text

    shapes = {n: list(v.shape) for n, v in feeds.items()}
    dims = dims_by_name(ctx.dims, ctx.spec.example)
    if ctx.second_shape and ctx.second_shape.get("source") == "case":
        where = "the case's second_inputs"
    else:
        where = "growing " + (", ".join(culprit_text(ctx, outcomes, ("rejected",))) or "all dims together")
    return SecondShapeError(f"at second shape {shapes}: rejected when {where} "
                            f"(dynamic dims {dims}): {short_error(exc)}")


# -- between the phases: the spool (harness.worker.spool) ----------------------------------------


def spool_group(ctx: GroupContext, torch_version: str) -> None:
    """Keep what the phases after the verdict need beside the exported file (which the verdict
    phase writes into the group's spool folder): the example-shape feeds, every shape the cells
    ran and the torch version; with ``keep_spool``, eager's outputs and the case's tolerances,
    what a runtime-only environment checks the same file against on another runtime release."""
    meta: dict[str, Any] = {"torch": torch_version}
    expected = None
    if ctx.job.keep_spool and ctx.references and ctx.spec is not None:
        expected = ctx.references[0]
        meta.update(atol=ctx.spec.atol, rtol=ctx.spec.rtol)
        if ctx.group.options.precision == "fp32" and ctx.floors(0) is not None:
            meta["floors"] = ctx.floors(0)
    write_spool(ctx.onnx_path.parent, ctx.onnx_path.name, ctx.feeds[0],
                [{n: list(v.shape) for n, v in f.items()} for f in ctx.feeds], expected, **meta)


def time_cell(job: Job, group: ExportGroup, cell: CellJob, spooled: SpooledFile) -> Record:
    """The latency phase of one cell: load its spooled file in the runtime and time it with the
    matrix's protocol. The record carries only the timing (the runner joins it to the verdict);
    a failure here is a failure at ``latency``."""
    from harness.runtimes import load_adapter
    from harness.worker.latency import measure, runtime_floor

    rec = Record.for_cell(job.run_id, group.key(cell), spooled.torch or "?", job.env, Status.PASS,
                          cell_id=cell.cell_id)
    durations: dict[str, float] = {}
    adapter = None
    try:
        with stage(Stage.LATENCY, durations):
            if spooled.error is not None:
                raise spooled.error
            adapter_cls = load_adapter(cell.runtime_name)
            adapter = adapter_cls(spooled.onnx, threads=job.threads, precision=group.options.precision,
                                  options=cell.runtime_options)
            adapter.prepare(spooled.shapes)
            adapter.activate()
            feeds0 = match_feeds(spooled.feeds, adapter.input_names())
            rec.latency_ms = measure(adapter.timed_call(feeds0), job.latency, job.threads)
            rec.latency_ms.floor_ms = runtime_floor(adapter_cls, job.latency, job.threads)
    except StageFailure as failure:
        rec.status = Status.FAIL
        rec.stage = Stage.LATENCY
        rec.error = short_error(failure.exc)
    finally:
        if adapter is not None:
            with contextlib.suppress(Exception):
                adapter.deactivate()
    rec.duration_s = durations
    rec.finished_at = time.time()
    return rec


def _to_numpy(x: Any):
    import numpy as np

    return np.asarray(x)
