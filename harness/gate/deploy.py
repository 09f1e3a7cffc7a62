"""Deployment targets in the gate: the runtime releases a team ships (matrix key ``deploy``).

A run with ``deploy`` tries each passing cell's file on those releases in runtime-only
environments (``graph.deploy``, harness.run.floors). A bump whose file no longer loads or matches
there is a new failure (``!``) even though the cell passes on the matrix's own runtime release;
a raised runtime floor (``graph.runtime_floor``) that the deployed release still meets is noted
as information.
"""
from __future__ import annotations

from packaging.version import InvalidVersion, Version

from harness.core.record import Record
from harness.core.status import Status
from harness.runtimes import RUNTIMES

PASS = Status.PASS.value   # as the records spell it

def _runtime(rec: Record) -> str:
    return rec.runtime.split("@", 1)[0]


def deploy_failure(base: Record | None, cand: Record) -> str | None:
    """Why the candidate's file fails on a deployed release the baseline's file worked on."""
    runtime = _runtime(cand)
    dep = ((cand.graph or {}).get("deploy") or {}).get(runtime)
    if not isinstance(dep, dict) or dep.get("status") == PASS:
        return None
    before = (((base.graph or {}).get("deploy") or {}).get(runtime)) if base is not None else None
    if isinstance(before, dict) and before.get("status") != PASS:
        return None   # it did not work there before either: no change to report as a regression
    package = RUNTIMES[runtime].package if runtime in RUNTIMES else runtime
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
    package = RUNTIMES[runtime].package if runtime in RUNTIMES else runtime
    return f"{package} floor raised {b['oldest_ok']} → {c['oldest_ok']}" + (f" ({c['reason']})" if c.get("reason") else "")
