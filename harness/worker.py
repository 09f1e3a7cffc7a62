"""The worker: runs inside one environment, imports torch once, runs that environment's cells.

Invoked by the runner as ``python -m harness.worker --job JOB.json --events-fd N``. For each
export group (case, exporter, opset, options) it builds the case, computes eager references,
exports once, checks the file, then runs every runtime cell of the group. Each finished cell is
sent to the runner as one JSON event on the events pipe; stdout/stderr of a group go to its log.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from harness.records import Record, Status


class SecondShapeError(RuntimeError):
    """The graph runs at the example shape but rejects a shape that differs in the dynamic dims."""


class StageFailure(Exception):
    def __init__(self, stage: str, exc: BaseException, status: Status = Status.FAIL) -> None:
        super().__init__(f"{stage}: {exc}")
        self.stage, self.exc, self.status = stage, exc, status


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
def stage(name: str, durations: dict[str, float]) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    except StageFailure:
        raise
    except Exception as exc:  # the one place where exceptions become statuses
        from harness.runtimes.base import RuntimeUnavailable

        if isinstance(exc, RuntimeUnavailable):
            raise StageFailure(name, exc, Status.SKIP) from exc
        traceback.print_exc()
        raise StageFailure(name, exc) from exc
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

    def __init__(self, job: dict[str, Any], group: dict[str, Any], workdir: Path) -> None:
        self.job, self.group = job, group
        self.durations: dict[str, float] = {}
        self.onnx_path = workdir / f"{group['gid']}.onnx"
        self.failure: StageFailure | None = None
        self.spec = None
        self.graph: dict[str, Any] = {}
        self.notes: list[str] = []
        self.feeds: list[dict[str, Any]] = []
        self.references: list[list[Any]] = []

    def prepare(self) -> None:
        from harness import export as exp
        from harness.cases import CaseSkipped, build_case
        from harness.parity import flatten_outputs, second_shape_inputs

        import torch

        g, opts = self.group, self.group.get("options", {})
        try:
            with stage("export", self.durations):
                try:
                    self.spec = build_case(g["case"], g["case_ref"], Path(self.job["base_dir"]),
                                           g.get("atol"), g.get("rtol"))
                except CaseSkipped as exc:
                    raise StageFailure("export", exc, Status.SKIP) from exc
                if self.spec.was_training:
                    self.notes.append("case returned a model in training mode; exported in eval mode")
                dims = self.spec.dynamic_dims if opts.get("dynamic", True) else {}
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
                exp.export_model(self.spec, g["exporter"], int(g["opset"]), self.onnx_path,
                                 dynamic=opts.get("dynamic", True),
                                 constant_folding=opts.get("constant_folding", True),
                                 outputs=outputs)
            with stage("check", self.durations):
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


def run_cell(ctx: GroupContext, cell: dict[str, Any], versions: dict[str, Any]) -> Record:
    from harness.latency import LatencyProtocol, measure
    from harness.parity import compare_outputs
    from harness.runtimes import load_runner

    job, g = ctx.job, ctx.group
    rec = Record(run_id=job["run_id"], case=g["case"], torch=versions["torch"],
                 exporter=g["exporter"], opset=int(g["opset"]), runtime=cell["runtime"],
                 status=Status.PASS.value, cell_id=cell["cell_id"], env=job["env"],
                 options=dict(g.get("options", {})), versions=dict(versions),
                 graph=ctx.graph, opset_actual=ctx.graph.get("opset"), notes=list(ctx.notes))
    durations = dict(ctx.durations)
    runner = None
    try:
        if ctx.failure:
            raise ctx.failure
        with stage("load", durations):
            runner_cls = load_runner(cell["runtime_name"])
            runner = runner_cls(ctx.onnx_path, threads=job.get("threads"),
                                precision=g.get("options", {}).get("precision", "fp32"),
                                options=cell.get("runtime_options"))
            if hasattr(runner, "prepare"):  # runtimes that build for given shapes (TensorRT profiles)
                runner.prepare([{n: tuple(v.shape) for n, v in f.items()} for f in ctx.feeds])
            runner.activate()
            rec.versions["runtime"] = runner_cls.version()
            graph_inputs = runner.input_names()
        outputs = []
        with stage("run", durations):
            for i, feeds in enumerate(ctx.feeds):
                use = _match_feeds(feeds, graph_inputs)
                try:
                    outputs.append([_to_numpy(o) for o in runner.infer(use)])
                except Exception as exc:
                    if i == 0:
                        raise
                    shapes = {n: list(v.shape) for n, v in use.items()}
                    culprits = _culprit_dims(ctx, runner, graph_inputs)
                    raise SecondShapeError(
                        f"at second shape {shapes}: rejected when growing {', '.join(culprits) or 'all dims together'} "
                        f"(dynamic dims {ctx.spec.dynamic_dims}): {short_error(exc)}") from exc
        with stage("parity", durations):
            parity = {"atol": ctx.spec.atol, "rtol": ctx.spec.rtol, "shapes": []}
            for i, (ref, out) in enumerate(zip(ctx.references, outputs)):
                label = "example shape" if i == 0 else "second shape"
                stats = compare_outputs(ref, out, ctx.spec.atol, ctx.spec.rtol, label)
                shape = {n: list(v.shape) for n, v in ctx.feeds[i].items()}
                parity["shapes"].append({"inputs": shape, **stats})
            parity["max_abs"] = max(s["max_abs"] for s in parity["shapes"])
            parity["max_rel"] = max(s["max_rel"] for s in parity["shapes"])
            rec.parity = parity
        with stage("latency", durations):
            protocol = LatencyProtocol.from_dict(job.get("latency"))
            if job.get("latency", {}).get("enabled", True) is not False:
                feeds0 = _match_feeds(ctx.feeds[0], graph_inputs)
                rec.latency_ms = measure(runner.timed_call(feeds0), protocol, job.get("threads"))
    except StageFailure as failure:
        rec.status = failure.status.value
        rec.stage = None if failure.status is Status.SKIP else failure.stage
        rec.error = short_error(failure.exc)
        if failure.status is Status.SKIP:
            rec.reason = str(failure.exc)
    finally:
        if runner is not None:
            rec.versions.setdefault("runtime", runner_cls.version())
            rec.options["precision"] = runner.facts.get("precision", "fp32")
            rec.graph = {**rec.graph, "runtime_facts": runner.facts}
            with contextlib.suppress(Exception):
                runner.deactivate()
    rec.duration_s = durations
    rec.finished_at = time.time()
    return rec


def _culprit_dims(ctx: GroupContext, runner: Any, graph_inputs: list[str]) -> list[str]:
    """Grow one named dynamic dim at a time to say which input and dim the graph rejects."""
    from harness.export import input_names
    from harness.parity import second_shape_inputs

    import torch

    names = input_names(ctx.spec)
    culprits = []
    for dim_name in sorted({n for dims in ctx.spec.dynamic_dims.values() for n in dims.values()}):
        only = {i: {d: n for d, n in dims.items() if n == dim_name}
                for i, dims in ctx.spec.dynamic_dims.items()}
        grown = second_shape_inputs(ctx.spec.inputs, {i: d for i, d in only.items() if d})
        tensors = [t for t in grown if isinstance(t, torch.Tensor)]
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, tensors)}
        try:
            runner.infer(_match_feeds(feeds, graph_inputs))
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


def write_bundle(ctx: GroupContext, rec: Record, bundle_dir: Path, log_path: Path) -> None:
    """Everything needed to reproduce a failing cell, beside the run."""
    import numpy as np

    bundle_dir.mkdir(parents=True, exist_ok=True)
    if ctx.onnx_path.exists():
        shutil.copy2(ctx.onnx_path, bundle_dir / "model.onnx")
        data = ctx.onnx_path.with_name(ctx.onnx_path.name + ".data")
        if data.exists():
            shutil.copy2(data, bundle_dir / data.name)
    for i, feeds in enumerate(ctx.feeds):
        np.savez(bundle_dir / ("inputs.npz" if i == 0 else f"inputs_shape{i + 1}.npz"), **feeds)
    (bundle_dir / "versions.json").write_text(json.dumps(rec.versions, indent=2))
    cell_job = {**ctx.job, "groups": [{**ctx.group, "cells": [c for c in ctx.group["cells"]
                                                              if c["cell_id"] == rec.cell_id]}]}
    (bundle_dir / "cell.json").write_text(json.dumps(cell_job, indent=2))
    with contextlib.suppress(OSError):
        shutil.copy2(log_path, bundle_dir / "cell.log")
    root = Path(__file__).resolve().parent.parent
    rec.bundle = str(bundle_dir)
    rec.repro = (f"PYTHONPATH={root} {sys.executable} -m harness.worker "
                 f"--job {bundle_dir / 'cell.json'} --print")


@contextlib.contextmanager
def redirect_fds(path: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (Python and C level) to ``path`` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_job(job: dict[str, Any], emit) -> None:
    versions = package_versions()
    emit({"event": "hello", "versions": versions, "pid": os.getpid()})
    run_dir = Path(job["run_dir"])
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harness-export-") as tmp:
        for group in job["groups"]:
            emit({"event": "group_start", "gid": group["gid"]})
            log_path = logs / f"{group['gid']}.log"
            ctx = GroupContext(job, group, Path(tmp))
            with redirect_fds(log_path):
                ctx.prepare()
            for cell in group["cells"]:
                emit({"event": "cell_start", "cell_id": cell["cell_id"]})
                with redirect_fds(log_path):
                    print(f"=== cell {cell['cell_id']} ===", flush=True)
                    rec = run_cell(ctx, cell, versions)
                    rec.log = str(log_path)
                    if rec.status == Status.FAIL.value and job.get("bundles", True):
                        write_bundle(ctx, rec, run_dir / "bundles" / cell["cell_id"], log_path)
                emit({"event": "record", "record": rec.to_dict()})
            for p in Path(tmp).glob(f"{group['gid']}.onnx*"):
                p.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.worker")
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--events-fd", type=int, default=None)
    parser.add_argument("--print", action="store_true", help="print records (repro mode)")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    faulthandler.enable()
    if args.events_fd is not None:
        stream = os.fdopen(args.events_fd, "w", buffering=1)
    else:
        stream = sys.stdout

    def emit(event: dict[str, Any]) -> None:
        if args.print and event.get("event") != "record":
            return
        payload = event["record"] if args.print else event
        stream.write(json.dumps(payload, default=str) + "\n")
        stream.flush()

    if args.print:
        job = {**job, "bundles": False, "run_dir": tempfile.mkdtemp(prefix="harness-repro-")}
    run_job(job, emit)
    emit({"event": "bye"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
