"""The one run workflow: a plan → a finished, rendered run directory.

Every command that runs cells goes through here: the matrix command (``harness.pipeline``),
the gate and bisect (``harness.gate.sources.run_cells``), and ``merge`` for shard runs. Each
step is one call: ``execute`` (the run core; run.json complete before the run starts, immutable
once it is finished), ``reduce_run`` (when the matrix asks for reduced graphs), ``render_run``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from harness.console import console
from harness.report import render_run
from harness.run.context import RunRequest
from harness.store.rundir import finalize
from harness.store.runs import read_run_meta


def run_plan(request: RunRequest, log: Callable[..., None] | None = None) -> Path:
    """Run, reduce (``reduce: true``) and render ``request``'s plan; returns the run directory."""
    from harness.run.execute import execute

    run_dir = execute(request)
    if request.matrix.reduce:
        from harness.run.reduce import reduce_run

        reduce_run(run_dir, timeout_s=request.matrix.reduce_timeout_s, log=log or console.print)
    render_run(run_dir, request.reports)
    return run_dir


def finish_merged(run_dir: Path, reports: Path) -> Path:
    """A merged run (``harness.store.merge.merge_runs``): finalized into the store, rendered."""
    meta = read_run_meta(run_dir)
    finalize(run_dir, meta, reports, ended=meta.ended)
    render_run(run_dir, reports)
    return run_dir
