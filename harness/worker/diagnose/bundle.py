"""A failing cell's bundle: everything needed to reproduce it beside the run, and the one-line
``repro`` command that re-runs just that cell."""
from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sys
import traceback
from pathlib import Path

from harness.core.paths import import_root
from harness.core.record import Record
from harness.core.wire import WORKER_MODULE
from harness.worker.diagnose.repro import write_upstream
from harness.worker.stages import GroupContext


def write_bundle(ctx: GroupContext, rec: Record, bundle_dir: Path, log_path: Path) -> None:
    """Everything needed to reproduce a failing cell, beside the run."""
    import numpy as np

    bundle_dir.mkdir(parents=True, exist_ok=True)
    if ctx.onnx_path.exists():
        shutil.copy2(ctx.onnx_path, bundle_dir / "model.onnx")
        data = ctx.onnx_path.with_name(ctx.onnx_path.name + ".data")
        if data.exists():
            shutil.copy2(data, bundle_dir / data.name)
    # Every tensor leaf of the (nested, keyword) inputs under its ONNX input name; inputs.json
    # maps names back to paths in the case's structure and keeps the non-tensor leaves.
    structure = []
    for i, (feeds, inputs) in enumerate(zip(ctx.feeds, ctx.shapes)):
        suffix = "" if i == 0 else f"_shape{i + 1}"
        np.savez(bundle_dir / f"inputs{suffix}.npz", **feeds)
        structure.append({"file": f"inputs{suffix}.npz", "leaves": inputs.describe()})
    if structure:
        (bundle_dir / "inputs.json").write_text(json.dumps(structure, indent=1))
    # Eager outputs and the case's tolerances: what `harness reduce` checks a parity failure against.
    for i, refs in enumerate(ctx.references):
        np.savez(bundle_dir / ("expected.npz" if i == 0 else f"expected_shape{i + 1}.npz"),
                 **{f"output_{k}": v for k, v in enumerate(refs)})
    if ctx.spec is not None:
        (bundle_dir / "tolerance.json").write_text(json.dumps({"atol": ctx.spec.atol, "rtol": ctx.spec.rtol}))
    (bundle_dir / "versions.json").write_text(json.dumps(rec.versions, indent=2))
    ctx.job.replace(groups=(ctx.group.only(rec.cell_id),)).write(bundle_dir / "cell.json")
    with contextlib.suppress(OSError):
        shutil.copy2(log_path, bundle_dir / "cell.log")
    rec.bundle = str(bundle_dir)
    try:
        write_upstream(ctx, rec, bundle_dir)   # repro.py, ISSUE.md, ONNX test data
    except Exception as exc:  # noqa: BLE001 - the bundle's extras never cost the cell its record
        traceback.print_exc()
        rec.pass_not_run("bundle", f"repro.py, ISSUE.md or the test data not written: {type(exc).__name__}: {exc}")
    pipeline = (rec.graph or {}).get("pipeline") or {}
    if rec.stage == "step" and pipeline.get("failed_index") is not None:
        # model.onnx is the file before the failing step: repro.py runs that step alone.
        from harness.worker.steps import repro_script

        step = ctx.group.steps[pipeline["failed_index"]]
        (bundle_dir / "repro.py").write_text(repro_script(step, pipeline.get("name", ""), Path(ctx.job.base_dir)))
    rec.repro = (f"PYTHONPATH={shlex.quote(str(import_root()))} {shlex.quote(sys.executable)} "
                 f"-m {WORKER_MODULE} --job {shlex.quote(str(bundle_dir / 'cell.json'))} --print")
