"""The ``optimum`` exporter: Hugging Face Optimum's own ONNX export of a transformers case.

``onnx_export_from_model`` on the case's in-memory transformers model, as a user of Optimum calls
it: Optimum's ONNX config (inputs, dynamic axes, names), its model patches, its TorchScript-based
``torch.onnx.export`` call and its post-processing, for the case's task, at the cell's opset,
``monolith=True`` (one file: a cell loads one graph). Then Optimum's own validation
(``validate_models_outputs``: ONNX Runtime CPU against the patched eager model on its dummy
inputs, its ``ATOL_FOR_VALIDATION``) runs, and its verdict is kept in the record's
``graph["optimum_validation"]`` beside the harness's own stages; where the two disagree the
record carries a note.

Only transformers zoo cases (``cases: [transformers]``) carry what Optimum needs; any other case
with this exporter is a ``skip`` with the reason. Worker side: Optimum is imported lazily.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from harness.core.record import Record
from harness.core.status import Status
from harness.worker.cases import CaseSkipped, CaseSpec

VALIDATION = "optimum_validation"


class NotAnOptimumCase(CaseSkipped):
    """The case is not a transformers architecture Optimum can export."""


def export_optimum(spec: CaseSpec, opset: int, path: Path, dynamic: bool = True,
                   constant_folding: bool = True) -> dict[str, Any]:
    """Export ``spec`` with Optimum to ``path``; return graph facts (export settings, validation)."""
    info = getattr(spec.model, "optimum_export", None)
    if info is None:
        raise NotAnOptimumCase(
            f"the optimum exporter exports transformers architectures (cases: [transformers]); "
            f"case {spec.name!r} is not one")
    try:
        from optimum.exporters.onnx import onnx_export_from_model
    except ImportError as exc:
        raise CaseSkipped(f"optimum-onnx is not installed in this environment ({exc})") from exc

    model = spec.model.model
    task, shapes = info["task"], dict(info.get("shapes", {}))
    with tempfile.TemporaryDirectory(prefix="harness-optimum-") as tmp:
        out = Path(tmp)
        onnx_export_from_model(model, out, task=task, opset=opset, monolith=True, do_validation=False,
                               no_dynamic_axes=not dynamic, do_constant_folding=constant_folding,
                               device="cpu", **shapes)
        files = sorted(p.name for p in out.glob("*.onnx"))
        if len(files) != 1:
            raise RuntimeError(f"Optimum wrote {len(files)} ONNX files {files} for {task}; a cell loads one")
        if any(out.glob("*_data")) or any(out.glob("*.data")):
            raise RuntimeError("Optimum wrote external data; the zoo's tiny models should not need it")
        validation = validate(model, task, shapes, out, files[0])
        shutil.move(str(out / files[0]), str(path))
    return {VALIDATION: validation,
            "optimum_export": {"task": task, "monolith": True, "file": files[0], "shapes": shapes}}


def validate(model: Any, task: str, shapes: dict[str, int], folder: Path, file: str) -> dict[str, Any]:
    """Optimum's own verdict on the file: ``ok`` and, when not, the error it raised."""
    from optimum.exporters.onnx.convert import validate_models_outputs
    from optimum.exporters.onnx.utils import _get_submodels_and_onnx_configs
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    onnx_config, models = _get_submodels_and_onnx_configs(
        model=model, task=task, monolith=True, custom_onnx_configs={}, custom_architecture=False,
        _variant="default", library_name="transformers")
    atol = onnx_config.ATOL_FOR_VALIDATION
    if isinstance(atol, dict):
        atol = atol[task.replace("-with-past", "")]
    result: dict[str, Any] = {"atol": float(atol), "ok": True}
    try:
        validate_models_outputs(
            models_and_onnx_configs=models,
            onnx_named_outputs=[list(cfg.outputs) for _, cfg in models.values()],
            output_dir=folder, atol=atol, onnx_files_subpaths=[file] * len(models),
            input_shapes={**DEFAULT_DUMMY_SHAPES, **shapes}, device="cpu", use_subprocess=False)
    except Exception as exc:  # noqa: BLE001 - Optimum's verdict, kept, never a harness failure
        result.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    return result


def note_disagreement(rec: Record) -> None:
    """A note when Optimum's validation and the harness's verdict on the cell disagree."""
    validation = rec.graph.get(VALIDATION)
    if not validation or rec.status not in (Status.PASS, Status.FAIL):
        return
    ours_ok = rec.status is Status.PASS
    if validation["ok"] == ours_ok:
        return
    if ours_ok:
        rec.notes.append(f"Optimum's validation fails ({validation.get('error')}) where the harness "
                         f"passes every stage on {rec.runtime}")
    else:
        rec.notes.append(f"Optimum's validation passes (ONNX Runtime CPU, its dummy inputs, atol "
                         f"{validation['atol']:g}) where the harness fails at {rec.stage} on {rec.runtime}")
