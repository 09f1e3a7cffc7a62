"""Blame for a cell of a post-export pipeline (``harness.worker.steps``): the step's library.

A step that failed (stage ``step``) is its library's bug, reported to its repository. A cell whose
runtime refused or crashed on the pipeline's file where a step wrote a file that fails strict shape
inference (types that disagree with what the nodes produce: onnxconverter-common issue 320) is
that step's too. Anything else falls through to the blame ladder, run on the pipeline's file.
"""
from __future__ import annotations

from typing import Any

from harness.core.record import Blame, Record
from harness.core.status import Status
from harness.core.steps import STEPS, repository_of


def _rung(name: str, outcome: str, detail: str) -> dict[str, Any]:
    return {"rung": name, "outcome": outcome, "detail": detail[:300]}


def blame_pipeline(rec: Record) -> Blame | None:
    """The step to blame, or None (not a pipeline cell, or nothing points at a step)."""
    pipeline = (rec.graph or {}).get("pipeline") or {}
    steps = pipeline.get("steps") or []
    if rec.stage == "step":
        failed = next((s for s in steps if s.get("status") not in (None, Status.PASS.value)), steps[-1] if steps else None)
        if failed is None:
            return None
        name = failed["step"]
        library = STEPS[name].call if name in STEPS else name
        return Blame("pipeline-step", f"step {name} of pipeline {pipeline.get('name')} fails on a file that "
                     f"passed the ONNX checker ({library}): {failed.get('error') or rec.error or ''}"[:300],
                     repository_of(name), [_rung(name, "fails", failed.get("error") or rec.error or "")])
    if rec.stage in ("load", "run"):
        bad = next((s for s in steps if s.get("strict_shape_inference") not in (None, "ok")), None)
        if bad is not None:
            return Blame("pipeline-step", f"step {bad['step']} wrote a file that fails strict shape inference "
                         f"({bad['strict_shape_inference']}); the runtime refuses it at {rec.stage}"[:300],
                         repository_of(bad["step"]),
                         [_rung("strict-shape-inference", "fails", bad["strict_shape_inference"]),
                          _rung("runtime", "fails", rec.error or "")])
    return None
