"""Smallest failing graph, the runner's half: picks a stored run's cells that failed at load, run
or parity and have a bundle, installs Polygraphy on demand into a folder of its own beside the
environments (never into an environment: one stays exactly what its marker lists), and starts the
driver (``harness.worker.diagnose.reduce``) in the cell's own environment with that folder on
PYTHONPATH; the outcome goes to the run's ``reductions.jsonl`` (a finished run's results are
immutable; ``harness.store`` joins it into ``record.graph["reduced"]`` on read)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from harness.core.status import Stage, Status
from harness.core.wire import REDUCE_MODULE, Reduction

ELIGIBLE_STAGES = (Stage.LOAD.value, Stage.RUN.value, Stage.PARITY.value)
ELIGIBLE_STATUSES = (Status.FAIL, Status.XFAIL)
DEFAULT_TIMEOUT_S = 120.0
# Pinned: Polygraphy and onnx-graphsurgeon are pure Python and need only onnx and numpy, which
# every environment has; onnxruntime (fallback shape inference) is in every CPU environment.
POLYGRAPHY = ("polygraphy==0.53.6", "onnx-graphsurgeon==0.6.1")


def eligible(rec: Any) -> str | None:
    """Why a record cannot be reduced, or None when it can."""
    if rec.status not in ELIGIBLE_STATUSES or rec.stage not in ELIGIBLE_STAGES:
        return (f"{rec.status.value}{f' at {rec.stage}' if rec.stage else ''}: only failures at "
                f"{', '.join(ELIGIBLE_STAGES)} are reduced")
    return None


def bundle_dir(run_dir: Path, rec: Any) -> Path | None:
    if not rec.bundle:
        return None
    recorded = Path(rec.bundle)
    for folder in (recorded if recorded.is_absolute() else Path(run_dir) / recorded,
                   Path(run_dir) / "bundles" / recorded.name):
        if (folder / "model.onnx").exists() and (folder / "cell.json").exists():
            return folder
    return None


def polygraphy_dir() -> Path:
    """Polygraphy installed once into a folder beside the environments (uv's cache makes it cheap)."""
    import fcntl

    from harness.core.paths import envs_dir
    from harness.envs.provider import uv_bin

    root = envs_dir() / ".tools"
    target = root / "-".join(p.replace("==", "") for p in POLYGRAPHY)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            proc = subprocess.run([uv_bin(), "pip", "install", "--quiet", "--no-deps", "--target",
                                   str(target), *POLYGRAPHY], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"installing {' '.join(POLYGRAPHY)} failed: "
                                   f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
            (target / ".complete").write_text("")
    return target


def reduce_cell(run_dir: Path, rec: Any, timeout_s: float, provider: str = "venv",
                existing: str | None = None) -> dict[str, Any]:
    """Reduce one stored cell in its own environment (``existing``: the interpreter of an existing
    one, used as it is); the outcome as ``graph['reduced']``."""
    from harness.core.paths import envs_dir, import_root

    bundle = bundle_dir(run_dir, rec)
    if bundle is None:
        return Reduction(failed=True, note="no bundle with model.onnx for this cell").to_dict()
    if provider not in ("venv", "existing-python"):
        return Reduction(failed=True, note=f"the cell ran in a {provider} environment; reductions run in the "
                              "cell's uv environment or interpreter (run the matrix with the venv provider)").to_dict()
    python = Path(existing) if existing else envs_dir() / rec.env / "bin" / "python"
    if not python.exists():
        return Reduction(failed=True, note=f"environment {rec.env} is not on this machine ({python} missing); "
                              "reductions run in the cell's uv environment").to_dict()
    try:
        tools = polygraphy_dir()
    except (RuntimeError, OSError) as exc:
        return Reduction(failed=True, note=f"Polygraphy is not available: {exc}").to_dict()
    work = Path(run_dir) / "reduce" / rec.cell_id
    work.mkdir(parents=True, exist_ok=True)
    (work / "record.json").write_text(rec.to_json())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(import_root()), str(tools)]),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), POLYGRAPHY_AUTOINSTALL_DEPS="0")
    env.pop("VIRTUAL_ENV", None)
    if existing:   # nothing is written inside an existing environment
        from harness.envs.existing import pycache_dir

        env.update(PYTHONNOUSERSITE="1", PYTHONPYCACHEPREFIX=str(pycache_dir()))
    cmd = [str(python), "-m", REDUCE_MODULE, "reduce", "--bundle", str(bundle),
           "--record", str(work / "record.json"), "--timeout", str(timeout_s), "--work", str(work)]
    with open(work / "driver.log", "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                  timeout=timeout_s + 120)
        except subprocess.TimeoutExpired:
            return Reduction(failed=True, note=f"the reduction did not end within {timeout_s:g} s (+120 s)",
                             timeout_s=timeout_s).to_dict()
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("REDUCTION ")), None)
    if line is None:
        return Reduction(failed=True, note=f"the reduction driver exited {proc.returncode} without a result "
                              f"(log: {work / 'driver.log'})").to_dict()
    return json.loads(line.removeprefix("REDUCTION "))


def reduce_run(run_dir: Path, cells: list[str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
               log: Any = print) -> dict[str, dict[str, Any]]:
    """Reduce the eligible failing cells of a stored run (or the named ones, which must be
    eligible); each outcome is appended to the run's reductions.jsonl. Returns cell id → outcome."""
    from harness.store.reductions import append_reduction
    from harness.store.runs import load_run

    meta, records = load_run(run_dir)
    if cells:
        by_id = {r.cell_id: r for r in records}
        missing = [c for c in cells if c not in by_id]
        if missing:
            raise FileNotFoundError(f"run {Path(run_dir).name} has no cell {missing[0]!r}")
        chosen = [by_id[c] for c in cells]
        for rec in chosen:
            if (why := eligible(rec)) is not None:
                raise ValueError(f"cell {rec.cell_id} cannot be reduced: {why}")
    else:
        chosen = [r for r in records if eligible(r) is None and bundle_dir(run_dir, r) is not None]
    results = {}
    for rec in chosen:
        log(f"reducing {rec.cell_id} ({rec.stage}: {(rec.error or '')[:100]}) …")
        marker = meta.environments.get(rec.env) or {}
        provider = marker.get("provider", "venv")
        existing = (marker.get("existing") or {}).get("python") if provider == "existing-python" else None
        try:
            outcome = reduce_cell(Path(run_dir), rec, timeout_s, provider, existing)
        except Exception as exc:  # noqa: BLE001 - a broken reduction is this cell's pass not run, said
            outcome = Reduction(failed=True, note=f"the reduction broke: {type(exc).__name__}: {exc}"[:400]).to_dict()
        append_reduction(Path(run_dir), rec.cell_id, outcome)
        results[rec.cell_id] = outcome
        log(f"  {describe(outcome)}")
    return results


def describe(outcome: dict[str, Any]) -> str:
    """One line for a terminal."""
    if outcome.get("file"):
        ops = ", ".join(f"{op}×{n}" for op, n in (outcome.get("ops") or {}).items())
        text = (f"{outcome.get('original_nodes', '?')} → {outcome['nodes']} nodes ({ops}) in "
                f"{outcome.get('seconds', '?')} s: {outcome.get('check', '')}; {outcome['file']}")
        return text + (f" ({outcome['note']})" if outcome.get("note") else "")
    return f"not reduced: {outcome.get('note', 'no reason given')}"
