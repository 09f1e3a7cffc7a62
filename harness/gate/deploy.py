"""Deployment targets in the gate: the runtime releases a team ships (matrix key ``deploy``).

A run with ``deploy`` tries each passing cell's file on those releases in runtime-only
environments (``graph.deploy``, harness.run.post.runtime_floors). A bump whose file no longer loads or matches
there is a new failure (``!``) even though the cell passes on the matrix's own runtime release;
a raised runtime floor (``graph.runtime_floor``) that the deployed release still meets is noted
as information. A passing candidate cell whose file was not tried on the release the gate's
matrix deploys (the release could not be installed, or the record comes from a run that did not
try it) cannot be judged: the gate cannot tell (exit 2), never "no regression".
"""
from __future__ import annotations

from typing import Any, Mapping

from packaging.version import InvalidVersion, Version

from harness.core.passes import NOT_INSTALLED, runtime_name
from harness.core.record import Record
from harness.core.status import Status
from harness.runtimes import RUNTIMES

PASS = Status.PASS.value   # as the records spell it


def _runtime(rec: Record) -> str:
    return runtime_name(rec.runtime)


def _package(runtime: str) -> str:
    return RUNTIMES[runtime].package if runtime in RUNTIMES else runtime


def _checked(dep: Any) -> bool:
    """A deploy result that says something about the file: it was tried (not an install failure)."""
    return isinstance(dep, dict) and dep.get("stage") != NOT_INSTALLED


def deploy_unchecked(cand: Record, targets: Mapping[str, str]) -> str | None:
    """Why a passing candidate's file was not tried on the release ``targets`` (the gate's matrix
    ``deploy``: runtime → release) names for its runtime; None when it was, or none is named."""
    runtime = _runtime(cand)
    target = targets.get(runtime)
    if target is None or not cand.status.passed:
        return None
    dep = ((cand.graph or {}).get("deploy") or {}).get(runtime)
    if isinstance(dep, dict) and dep.get("version") == target and _checked(dep):
        return None
    why = (cand.passes_not_run or {}).get("deploy")
    if why is None and isinstance(dep, dict) and dep.get("version") == target:
        why = f"it could not be installed: {dep.get('error')}"
    return f"{_package(runtime)} {target} was not tried on the file: {why or f'run {cand.cached_from or cand.run_id} did not try it'}"


def deploy_failure(base: Record | None, cand: Record) -> str | None:
    """Why the candidate's file fails on a deployed release the baseline's file worked on."""
    runtime = _runtime(cand)
    dep = ((cand.graph or {}).get("deploy") or {}).get(runtime)
    if not _checked(dep) or dep.get("status") == PASS:
        return None   # it works there, or was never tried (``deploy_unchecked`` says so)
    before = (((base.graph or {}).get("deploy") or {}).get(runtime)) if base is not None else None
    if _checked(before) and before.get("status") != PASS:
        return None   # it did not work there before either: no change to report as a regression
    package = _package(runtime)
    floor = ((cand.graph or {}).get("runtime_floor") or {}).get(runtime) or {}
    why = floor.get("reason") or f"{dep.get('stage')} fails: {dep.get('error')}"
    return f"{why}; you deploy {package} {dep.get('version')}"


def floor_raised(base: Record | None, cand: Record) -> str | None:
    """'onnxruntime floor 1.16.3 → 1.18.1 (...)' when the candidate's file needs a newer release."""
    if base is None:
        return None
    runtime = _runtime(cand)
    b = (((base.graph or {}).get("runtime_floor") or {}).get(runtime)) or {}
    c = (((cand.graph or {}).get("runtime_floor") or {}).get(runtime)) or {}
    if not b.get("oldest_ok") or not c.get("oldest_ok"):
        return None
    try:
        raised = Version(c["oldest_ok"]) > Version(b["oldest_ok"])
    except InvalidVersion:
        return None
    if not raised:
        return None
    package = _package(runtime)
    return f"{package} floor raised {b['oldest_ok']} → {c['oldest_ok']}" + (f" ({c['reason']})" if c.get("reason") else "")
