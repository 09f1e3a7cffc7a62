"""The experiments that decide an export-side layer (worker side): the cell's own export call with
one thing changed, judged as the cell was.

- ``unoptimized``: the same call with ``optimize=False`` (torch.onnx's default is ``True`` since
  2.7: onnxscript's optimizer). The file passing where the cell's fails is the optimizer's bug.
- ``native``: the same call at the exporter's native opset (18: torch.onnx translates at 18 and
  down-converts), without the optimizer. It passing where the converted file fails is the
  version converter's; ``onnx_converted`` then converts that native file with
  ``onnx.version_converter`` alone: it failing the same way is onnx's converter, else onnxscript's.
- ``inlined``: the cell's file with its model-local functions inlined
  (``onnx.inliner.inline_local_functions``), for a runtime that rejects the functions.

Each result is ``{experiment, outcome ("passes" | "fails" | "not run"), detail, seconds}`` and is
kept on the export group's context: every runtime cell of a group shares it. The native export does
not depend on the group's opset: the groups of one export family (``ExportGroup.capture_key``) that
one worker runs share its file and judgement through the worker's evidence folder
(``ctx.evidence_dir``), keyed by the family, the torch release, the feeds, eager's references and
the model's weights; each group converts that file to its own opset itself (``"shared": true``).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from harness.core.errors import short_error

NATIVE_OPSET = 18


def _cached(ctx: Any, name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    cache = ctx.__dict__.setdefault("_layer_experiments", {})
    if name not in cache:
        t0 = time.perf_counter()
        try:
            result = run()
        except Exception as exc:  # noqa: BLE001 - an experiment that cannot run decides nothing
            result = {"outcome": "not run", "detail": f"{type(exc).__name__}: {exc}"[:300]}
        cache[name] = {"experiment": name, **result, "seconds": round(time.perf_counter() - t0, 3)}
        return dict(cache[name])
    return {**cache[name], "shared": True}


def judge_file(ctx: Any, path: Path) -> dict[str, Any]:
    """The checker, then ONNX Runtime (CPU, default level) at every shape the cell ran, compared
    with eager as the cell was: ``{outcome, detail}``."""
    import numpy as np

    from harness.runtimes.base import match_feeds
    from harness.runtimes.ort_cpu import OrtCpuAdapter
    from harness.worker.export import check_model
    from harness.worker.parity import first_difference

    try:
        check_model(path)
    except Exception as exc:  # noqa: BLE001 - the finding
        return {"outcome": "fails", "detail": f"checker: {short_error(exc)}"[:300]}
    try:
        with OrtCpuAdapter(path) as adapter:
            names = adapter.input_names()
            outputs = [[np.asarray(o) for o in adapter.infer(match_feeds(f, names))] for f in ctx.feeds]
    except Exception as exc:  # noqa: BLE001 - the finding
        return {"outcome": "fails", "detail": f"onnxruntime: {short_error(exc)}"[:300]}
    differs = first_difference(ctx.references, outputs, ctx.spec.atol, ctx.spec.rtol)
    return {"outcome": "fails" if differs else "passes", "detail": (differs or "checker and ONNX Runtime agree "
                                                                      "with eager")[:300]}


def _export(ctx: Any, path: Path, **changes: Any) -> None:
    import torch

    from harness.worker.export import export_arguments

    g, opts = ctx.group, ctx.group.options
    args, kwargs, _ = export_arguments(ctx.spec, g.exporter, g.opset, opts.dynamic, opts.constant_folding,
                                       None, opts.dim_policy, switches=opts.switches())
    kwargs.update(changes)
    torch.onnx.export(ctx.spec.model, args, str(path), **kwargs)


def _supports(option: str) -> bool:
    import inspect

    import torch

    return option in inspect.signature(torch.onnx.export).parameters


def kept(ctx: Any, name: str) -> Path:
    """Where an experiment's file stays beside the group's file, for the bundle's layer repro."""
    return ctx.onnx_path.with_name(f"{ctx.onnx_path.stem}.layer-{name}.onnx")


def _keep(ctx: Any, name: str, path: Path) -> None:
    """The experiment's file, its external data (torch may write ``.data`` beside it) taken in,
    kept for the bundle; a file too large for one protobuf is not kept (the repro is then the
    export call)."""
    import onnx

    try:
        onnx.save(onnx.load(str(path)), str(kept(ctx, name)))
    except (ValueError, OSError):
        kept(ctx, name).unlink(missing_ok=True)


def optimizer_ran(ctx: Any) -> bool:
    """Whether the cell's own export ran the exporter's optimizer: its ``optimize`` option where
    the matrix sets one, else torch.onnx.export's default (False in 2.6, True from 2.7)."""
    import inspect

    import torch

    if ctx.group.exporter != "dynamo":
        return False
    chosen = getattr(ctx.group.options, "optimize", None)
    if chosen is not None:
        return bool(chosen)
    param = inspect.signature(torch.onnx.export).parameters.get("optimize")
    return bool(param is not None and param.default is True)


def unoptimized(ctx: Any) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        if not optimizer_ran(ctx):
            return {"outcome": "not run", "detail": "the cell's export ran without the optimizer"}
        with tempfile.TemporaryDirectory(prefix="harness-layer-") as tmp:
            path = Path(tmp) / "unoptimized.onnx"
            _export(ctx, path, optimize=False)
            result = judge_file(ctx, path)
            _keep(ctx, "unoptimized", path)
            return result
    return _cached(ctx, "optimize=False", run)


def _family_files(ctx: Any, name: str) -> tuple[Path, Path] | None:
    """Where the family's ``name`` experiment leaves its file and judgement in the worker's
    evidence folder: keyed by the family, the torch release and the model's weights, with what
    the judgement reads (``evidence_key``: feeds, eager's references, tolerances); None where any
    of them cannot be read: the group runs its own."""
    folder = getattr(ctx, "evidence_dir", None)
    state = getattr(getattr(ctx.spec, "model", None), "state_dict", None)
    if folder is None or state is None:
        return None
    try:
        import torch

        from harness.worker.evidence import evidence_key, values_digest

        weights = {k: v.detach().cpu().numpy() for k, v in state().items()}
        key = evidence_key(ctx, values_digest([name, torch.__version__, repr(ctx.group.capture_key()), weights]))
    except Exception:  # noqa: BLE001 - weights that do not convert (bfloat16): the group runs its own
        traceback.print_exc()
        return None
    return Path(folder) / f"{key}.{name}.onnx", Path(folder) / f"{key}.{name}.json"


def _family_judged(ctx: Any, name: str, path: Path, export: Callable[[], None]) -> dict[str, Any]:
    """``export`` writes the experiment's file to ``path``, judged by ``judge_file``; a group of the
    same family, release and inputs earlier in this worker did that already: its file is copied to
    ``path`` and its judgement taken (``"shared": true``)."""
    import onnx

    where = _family_files(ctx, name)
    if where is not None and where[0].exists() and where[1].exists():
        try:
            shutil.copyfile(where[0], path)
            return {**json.loads(where[1].read_text(encoding="utf-8")), "shared": True}
        except (OSError, ValueError):
            traceback.print_exc()
    export()
    result = judge_file(ctx, path)
    if where is not None:
        try:
            where[0].parent.mkdir(parents=True, exist_ok=True)
            tmp = where[0].with_name(f"{where[0].name}.{os.getpid()}.tmp")
            onnx.save(onnx.load(str(path)), str(tmp))      # external data taken in, like ``_keep``
            os.replace(tmp, where[0])
            where[1].write_text(json.dumps(result), encoding="utf-8")
        except (ValueError, OSError):                      # too large for one protobuf: not shared
            traceback.print_exc()
    return result


def native(ctx: Any) -> dict[str, Any]:
    """The export at the native opset without the optimizer; with ``onnx_converted`` folded in
    (``converter``: what ``onnx.version_converter`` alone makes of it at the cell's opset)."""
    def run() -> dict[str, Any]:
        if ctx.group.exporter != "dynamo" or ctx.group.opset >= NATIVE_OPSET:
            return {"outcome": "not run", "detail": f"the cell is at the native opset {NATIVE_OPSET} already"}
        import onnx

        with tempfile.TemporaryDirectory(prefix="harness-layer-") as tmp:
            path = Path(tmp) / "native.onnx"
            result = _family_judged(ctx, "native", path, lambda: _export(
                ctx, path, opset_version=NATIVE_OPSET, **({"optimize": False} if _supports("optimize") else {})))
            converted = Path(tmp) / "converted.onnx"
            try:
                onnx.save(onnx.version_converter.convert_version(onnx.load(str(path)), ctx.group.opset),
                          str(converted))
                result["converter"] = judge_file(ctx, converted)
            except Exception as exc:  # noqa: BLE001 - the converter raising is its finding
                result["converter"] = {"outcome": "fails", "detail": f"onnx.version_converter: {short_error(exc)}"[:300]}
            _keep(ctx, "native", path)
            return result
    return _cached(ctx, f"opset {NATIVE_OPSET}, optimize=False", run)


def inlined(ctx: Any, run_file: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """The cell's file with model-local functions inlined, run by ``run_file`` (the cell's runtime)."""
    def run() -> dict[str, Any]:
        import onnx
        import onnx.inliner

        model = onnx.load(str(ctx.onnx_path))
        if not model.functions:
            return {"outcome": "not run", "detail": "the file has no model-local functions"}
        with tempfile.TemporaryDirectory(prefix="harness-layer-") as tmp:
            path = Path(tmp) / "inlined.onnx"
            onnx.save(onnx.inliner.inline_local_functions(model), str(path))
            return run_file(path)
    return _cached(ctx, "inline local functions", run)
