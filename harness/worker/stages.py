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
from harness.core.record import Latency, Parity, Record
from harness.core.status import Stage, Status
from harness.core.wire import SPOOL_IDENTITY
from harness.runtimes.base import match_feeds
from harness.worker.diagnose.tracing import tracer_warnings
from harness.worker.dims import note_specialised
from harness.worker.export_log import ExportLog
from harness.worker.inputs import dims_by_name
from harness.worker.spool import SpooledFile, write_spool


class SecondShapeError(RuntimeError):
    """The graph runs at the example shape but rejects a shape that differs in the dynamic dims."""


class StepError(RuntimeError):
    """A step of the cell's pipeline failed (``harness.worker.steps``)."""


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
        self.export_log: Any = None                       # what torch logged while exporting (export_log)
        self.tracer_warnings: list[dict[str, Any]] = []   # TracerWarnings of the export (diagnose.tracing)
        self.clock: dict[str, float] = {}            # wall and CPU seconds of the shared stages
        # Capture reuse (harness.worker.capture_reuse): the family's shared capture, the export
        # log it began, and how this group's file was made (the record's ``export_made``).
        self.capture: Any = None
        self.capture_log: ExportLog | None = None
        self.made: dict[str, Any] | None = None
        self.divergences: dict[int, dict[str, Any]] = {}   # the divergence search per shape (evidence)
        self.evidence_dir: Path | None = None   # the worker's evidence folder (evidence, layer experiments)

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
        try:
            if self.spec is None and self.failure is None:   # a family's process may have built it
                self._reference_stage()
            if self.failure is None:
                self._export_stage()
                if self.group.steps:
                    self._run_pipeline()
        except StageFailure as failure:
            self.failure = failure

    def _reference_stage(self) -> None:
        from harness.worker.cases import CaseSkipped, build_case

        g = self.group
        with stage(Stage.REFERENCE, self.durations):
            try:
                self.spec = build_case(g.case, g.case_ref, Path(self.job.base_dir), g.atol, g.rtol)
            except CaseSkipped as exc:
                raise StageFailure(Stage.REFERENCE, exc, Status.SKIP) from exc
            if self.spec.was_training:
                self.notes.append("case returned a model in training mode; exported in eval mode")
            self._references()

    def _io_names(self) -> tuple[list[str], list[str]]:
        """The input and output names given at export."""
        from harness.worker.outputs import output_names

        outputs = output_names(self.output_paths)
        named = getattr(self.spec.model, "onnx_output_names", None)   # the case names them
        if named and len(named) == len(outputs):
            outputs = list(named)
        return self.spec.example.input_names(), outputs

    def capture_for_family(self, scratch: Path) -> None:
        """In a family's process (``harness.worker.capture_reuse``): the reference stage, then
        torch's capture once, for every opset's group forked from here. What torch said while
        capturing stays in this context's export log, which each group's export goes on with."""
        from harness.worker import capture_reuse
        from harness.worker import export as exp

        try:
            self._reference_stage()
        except StageFailure as failure:
            self.failure = failure
            return
        opts = self.group.options
        _, outputs = self._io_names()
        self.capture_log = ExportLog()
        with self.capture_log.watching():
            self.capture = capture_reuse.capture(lambda: exp.export_model(
                self.spec, "dynamo", self.group.opset, scratch, dynamic=opts.dynamic,
                constant_folding=opts.constant_folding, outputs=outputs, dim_policy=opts.dim_policy,
                switches=opts.switches()))
        if not self.capture.ok:
            self.capture_log = None
        self.made = capture_reuse.made(self.capture, None)

    def for_group(self, group: ExportGroup, workdir: Path) -> "GroupContext":
        """This family context as the context of one of its groups (in that group's own process,
        forked from the family's: nothing it changes reaches a sibling)."""
        self.group = group
        self.onnx_path = workdir / f"{group.gid}.onnx"
        return self

    def _export_stage(self) -> None:
        from harness.worker import export as exp

        g, opts = self.group, self.group.options
        names, outputs = self._io_names()
        capture = self.capture if self.capture is not None and self.capture.ok else None
        log = self.export_log = (self.capture_log if capture is not None and self.capture_log is not None
                                 else ExportLog())
        try:
            with stage(Stage.EXPORT, self.durations), tracer_warnings() as self.tracer_warnings:
                self.dim_marking, program, facts = exp.export_model(
                    self.spec, g.exporter, g.opset, self.onnx_path, dynamic=opts.dynamic,
                    constant_folding=opts.constant_folding, outputs=outputs, dim_policy=opts.dim_policy,
                    log=log, switches=opts.switches(), capture=capture)
                self.program = program   # torch.onnx's ONNXProgram (dynamo): node values for a blame
        except StageFailure as failure:
            self._note_export_log(log, failure.exc)
            raise
        self._note_export_log(log, None)
        with stage(Stage.CHECK, self.durations):
            self.graph = {**exp.graph_facts(self.onnx_path), **(facts or {}), **self.graph}
            if opts.switches():   # the exporter options axis: which files came out
                self.graph["layout"] = exp.file_layout(self.onnx_path)
                if len(self.graph["layout"]["files"]) > 1:
                    self.notes.append("the export wrote two files (model.onnx + model.onnx.data): a loader "
                                      "that takes one file or its bytes (a browser, some serving stacks) "
                                      "needs external_data=False or the data merged in")
            self._note_dims(names, program)
            # Names given at export are what deployment code feeds and fetches by: a lost
            # name is a note (the cell still runs by position), not a failure.
            for kind, given in (("input", names), ("output", outputs)):
                missing = [n for n in given if n not in self.graph[f"{kind}s"]]
                if missing:
                    self.notes.append(f"{kind} names given at export not in the graph: "
                                      f"{missing} (graph has {self.graph[f'{kind}s']})")
            exp.check_model(self.onnx_path)

    def _run_pipeline(self) -> None:
        """The pipeline's steps, each a stage ``step`` (``harness.worker.steps``): the file the
        cells load is the last step's; a step that fails leaves ``onnx_path`` at the file before
        it (what the bundle keeps) and fails every cell of the group at that step."""
        from harness.worker import steps as pipeline

        exported = self.onnx_path
        facts: dict[str, Any] = {"name": self.group.options.pipeline, "steps": []}
        self.graph["pipeline"] = facts
        for i, step in enumerate(self.group.steps):
            entry: dict[str, Any] = {"step": step["step"], "args": dict(step.get("args") or {})}
            facts["steps"].append(entry)
            try:
                with stage(Stage.STEP, self.durations):
                    try:
                        out = pipeline.run_step(step, i, self.onnx_path, exported, self.feeds,
                                                Path(self.job.base_dir), entry)
                    except ModuleNotFoundError as exc:
                        from harness.runtimes.base import RuntimeUnavailable

                        raise RuntimeUnavailable(f"step {step['step']} needs module {exc.name!r}, which this "
                                                 "environment does not have") from exc
            except StageFailure as failure:
                entry["status"] = failure.status.value
                entry["error"] = short_error(failure.exc)
                facts.update(failed=step["step"], failed_index=i)
                raise StageFailure(Stage.STEP, StepError(f"step {i + 1} ({step['step']}) of pipeline "
                                                         f"{facts['name']}: {short_error(failure.exc)}"),
                                   failure.status) from failure.exc
            entry["status"] = Status.PASS.value
            if entry.get("note"):   # what the step knows of where its file may misbehave
                self.notes.append(entry["note"])
            for fact, what in (("checker", "the ONNX checker rejects the file"),
                               ("strict_shape_inference", "strict shape inference fails")):
                if entry.get(fact) != "ok":
                    self.notes.append(f"after step {step['step']}, {what} ({entry[fact]}); the runtimes "
                                      "load the file as it is")
            self.onnx_path = out

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
    if ctx.made is not None:
        rec.export_made = dict(ctx.made)
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
    from harness.runtimes.base import ActiveAdapters
    from harness.worker.latency import binding_overhead, measure
    from harness.worker.noise import summary as noise_summary
    from harness.worker.parity import ParityError, compare_outputs, judge_quality, quality

    job, g = ctx.job, ctx.group
    adapter = None
    active = ActiveAdapters()   # from the load stage to the latency stage; closed after its facts are read
    try:
        if ctx.failure:
            raise ctx.failure
        with stage(Stage.LOAD, durations):
            adapter_cls = load_adapter(cell.runtime_name)
            adapter = adapter_cls(ctx.onnx_path, threads=job.threads, precision=g.options.precision,
                                options=cell.runtime_options)
            if g.steps:   # the pipeline's file may itself be fp16 / int8 (harness.core.steps)
                from harness.core.steps import precision_of

                adapter.file_precision = precision_of(g.steps)
            # Every shape the cell will run (TensorRT builds its optimisation profile from them).
            adapter.prepare([{n: tuple(v.shape) for n, v in f.items()} for f in ctx.feeds])
            active.enter_context(adapter)
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
            # A pipeline that ends in fp16 or int8 is judged by its own tolerances, and a
            # quantized one also by cosine and top-1 agreement (harness.core.steps.JUDGES).
            judge = g.judge or {}
            atol, rtol = judge.get("atol", ctx.spec.atol), judge.get("rtol", ctx.spec.rtol)
            parity = Parity(atol=atol, rtol=rtol)
            rec.parity = parity
            if judge:
                parity.extra["judge"] = dict(judge)
            if ctx.second_shape:
                parity.extra["second_shape"] = dict(ctx.second_shape)
            failed: ParityError | None = None
            # The model's own noise is judged at fp32 only (a reduced precision is its own budget).
            judged = g.options.precision == "fp32" and not judge
            for i, (ref, out) in enumerate(zip(ctx.references, outputs)):
                label = "example shape" if i == 0 else "second shape"
                try:
                    stats = compare_outputs(ref, out, atol, rtol, label, ctx.floors(i) if judged else None)
                except ParityError as exc:
                    stats, failed = {**exc.stats, "failed": True}, failed or exc
                if judge:
                    stats["quality"] = quality(ref, out)
                    if (miss := judge_quality(stats["quality"], judge, label)) is not None:
                        stats["failed"] = True
                        failed = failed or ParityError(miss, stats)
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
                    if job.floor:
                        rec.latency_ms.binding_overhead_ms = binding_overhead(adapter_cls, job.latency,
                                                                              job.threads)
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
        active.close()


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
    if ctx.job.floor:
        # The latency workers' binding overhead reads it: this process has onnx imported.
        from harness.runtimes.binding_overhead import keep_identity_model

        try:
            keep_identity_model(ctx.job.spool / SPOOL_IDENTITY)
        except Exception:  # noqa: BLE001 - the latency worker then writes its own
            traceback.print_exc()


def spool_key(spooled: SpooledFile) -> str | None:
    """What a spool gives every cell's timing: the file and its external data, the feeds and every
    shape the runtime is prepared for; None where the spool cannot say."""
    from harness.worker.capture_reuse import file_digest
    from harness.worker.evidence import values_digest

    digest = file_digest(spooled.onnx) if spooled.error is None else None
    return None if digest is None else values_digest([digest, spooled.feeds, spooled.shapes])


def timing_key(group: ExportGroup, cell: CellJob, spooled_key: str) -> str:
    """Everything a cell's timing depends on besides its job (protocol, threads, machine): its
    spool's key (``spool_key``), the runtime, its options and the precision. Two cells of one key
    time the same thing."""
    from harness.core.steps import precision_of
    from harness.worker.evidence import values_digest

    return values_digest([spooled_key, cell.runtime, cell.runtime_name, cell.runtime_options,
                          group.options.precision, precision_of(group.steps) if group.steps else None])


class SameFileTimings:
    """One timing per file in a latency worker: a cell whose file, feeds, runtime and runtime
    options are those of a cell this process already timed gets that timing, marked
    ``same_file_as`` (torch's dynamo exporter writes one opset-18 file for several asked opsets
    where it cannot convert down). Only a passing timing is shared (one taken on a busy machine
    stays marked ``loaded`` in both); a cell whose first timing failed is timed again. Each
    spool's file is hashed once, for all of its cells."""

    def __init__(self) -> None:
        self.timed: dict[str, tuple[str, Latency]] = {}
        self.spools: dict[Path, str | None] = {}

    def _spool_key(self, spooled: SpooledFile) -> str | None:
        if spooled.onnx not in self.spools:
            try:
                self.spools[spooled.onnx] = spool_key(spooled)
            except Exception:  # noqa: BLE001 - a file that cannot be hashed is timed on its own
                traceback.print_exc()
                self.spools[spooled.onnx] = None
        return self.spools[spooled.onnx]

    def time(self, job: Job, group: ExportGroup, cell: CellJob, spooled: SpooledFile) -> Record:
        t0 = time.perf_counter()
        found = self._spool_key(spooled)
        key = timing_key(group, cell, found) if found is not None else None
        if key in self.timed:
            first_cell, first = self.timed[key]
            rec = Record.for_cell(job.run_id, group.key(cell), spooled.torch or "?", job.env, Status.PASS,
                                  cell_id=cell.cell_id)
            rec.latency_ms = Latency.from_dict(first.to_dict())
            rec.latency_ms.same_file_as = first_cell
            rec.duration_s = {Stage.LATENCY.value: round(time.perf_counter() - t0, 6)}
            rec.finished_at = time.time()
            print(f"timed once with {first_cell}: the same file, inputs and runtime settings", flush=True)
            return rec
        rec = time_cell(job, group, cell, spooled)
        if key is not None and rec.status is Status.PASS and rec.latency_ms.median:
            self.timed[key] = (cell.cell_id, rec.latency_ms)
        return rec


def time_cell(job: Job, group: ExportGroup, cell: CellJob, spooled: SpooledFile) -> Record:
    """The latency phase of one cell: load its spooled file in the runtime and time it with the
    matrix's protocol. The record carries only the timing (the runner joins it to the verdict);
    a failure here is a failure at ``latency``."""
    from harness.runtimes import load_adapter
    from harness.runtimes.base import ActiveAdapters, LoadOptions
    from harness.worker.latency import binding_overhead, measure

    rec = Record.for_cell(job.run_id, group.key(cell), spooled.torch or "?", job.env, Status.PASS,
                          cell_id=cell.cell_id)
    durations: dict[str, float] = {}
    active = ActiveAdapters()
    try:
        with stage(Stage.LATENCY, durations):
            if spooled.error is not None:
                raise spooled.error
            adapter_cls = load_adapter(cell.runtime_name)
            cache = ({"load": LoadOptions(compiled_cache=Path(job.compiled_cache))}
                     if job.compiled_cache and "compiled_cache" in adapter_cls.load_options else {})
            adapter = adapter_cls(spooled.onnx, threads=job.threads, precision=group.options.precision,
                                  options=cell.runtime_options, **cache)
            if group.steps:
                from harness.core.steps import precision_of

                adapter.file_precision = precision_of(group.steps)
            adapter.prepare(spooled.shapes)
            active.enter_context(adapter)
            if adapter.facts.get("loaded_from_cache"):
                print(f"{adapter.name}: the compiled model loaded from {job.compiled_cache}", flush=True)
            feeds0 = match_feeds(spooled.feeds, adapter.input_names())
            rec.latency_ms = measure(adapter.timed_call(feeds0), job.latency, job.threads)
            if job.floor:
                rec.latency_ms.binding_overhead_ms = binding_overhead(adapter_cls, job.latency, job.threads,
                                                                      job.spool / SPOOL_IDENTITY)
    except StageFailure as failure:
        rec.status = Status.FAIL
        rec.stage = Stage.LATENCY
        rec.error = short_error(failure.exc)
    finally:
        active.close()
    rec.duration_s = durations
    rec.finished_at = time.time()
    return rec


def _to_numpy(x: Any):
    import numpy as np

    return np.asarray(x)
