"""Records the runner writes itself (skip, crash, timeout, environment failure), and the join of
a held verdict with its latency phase (``with_timing``)."""
from __future__ import annotations

from typing import Any

from harness.core.record import Record
from harness.core.status import Stage, Status
from harness.matrix.plan import Cell, EnvPlan


def planned_record(run_id: str, cell: Cell, env: str, status: Status, **kw: Any) -> Record:
    """A record the runner writes itself (skip, crash, timeout, environment failure)."""
    return Record.for_cell(run_id, cell.key, cell.torch, env, status, **kw)


def environment_failure_records(run_id: str, env_plan: EnvPlan, cells: list[Cell], exc: Exception) -> list[Record]:
    msg = str(exc).strip().splitlines()
    return [planned_record(run_id, c, env_plan.env.name, Status.CRASH, stage=None,
                           error=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500],
                           notes=["\n".join(msg[-10:])]) for c in cells]


def skip_records(run_id: str, env_plan: EnvPlan, cells: list[Cell], reason: str) -> list[Record]:
    return [planned_record(run_id, c, env_plan.env.name, Status.SKIP, reason=reason) for c in cells]


def with_timing(verdict: Record, timing: Record) -> Record:
    """A held verdict with its latency phase: the timing, or the failure that came instead (a
    crash or timeout of the latency worker stays one; anything else fails at ``latency``)."""
    verdict.latency_ms = timing.latency_ms
    for name, seconds in timing.duration_s.items():
        verdict.duration_s[name] = round(verdict.duration_s.get(name, 0.0) + seconds, 6)
    verdict.notes += [n for n in timing.notes if n not in verdict.notes]
    if timing.status is not Status.PASS:
        verdict.status = timing.status if timing.status in (Status.CRASH, Status.TIMEOUT) else Status.FAIL
        verdict.stage = Stage.LATENCY
        verdict.error = timing.error
        verdict.bundle = timing.bundle or verdict.bundle
        verdict.repro = timing.repro or verdict.repro
    verdict.finished_at = timing.finished_at or verdict.finished_at
    return verdict
