"""The one run workflow: a plan → a finished, rendered run directory.

Every command that runs cells goes through here: the matrix command (``harness.matrix_run``),
the gate and bisect (``harness.gate.sources.run_cells``), and ``merge`` for shard runs. Each
step is one call: ``execute`` (the run core and its optional passes: runtime releases, reduced
graphs when the matrix asks for them; run.json complete, with every pass that could not be made,
before the run is finished and immutable), ``render_run``.
"""
from __future__ import annotations

from pathlib import Path

from harness.report import render_run
from harness.run.context import RunRequest
from harness.store.rundir import finalize
from harness.store.runs import read_run_meta


def run_plan(request: RunRequest) -> Path:
    """Run (with its passes: ``harness.run.execute``) and render ``request``'s plan; returns the
    run directory."""
    from harness.run.execute import execute

    run_dir = execute(request)
    render_run(run_dir, request.reports)
    return run_dir


def finish_merged(run_dir: Path, reports: Path) -> Path:
    """A merged run (``harness.store.merge.merge_runs``): finalized into the store, rendered."""
    meta = read_run_meta(run_dir)
    finalize(run_dir, meta, reports, ended=meta.ended)
    render_run(run_dir, reports)
    return run_dir
