"""The run core's two values: what to run (``RunRequest``) and the run under way (``RunContext``).

A ``RunRequest`` is what the matrix command, the gate and bisect hand to ``harness.run_workflow``:
the plan, where its run goes and how it runs, with the run.json entries known before it starts
(a shard's identity), so that nothing reopens a finished run. A ``RunContext`` is what the
scheduler, the supervisors and the results writer share once the run directory is held: the worker's
job, the provider, the limits, the run's metadata and the stop signal, instead of the same ten
values passed down each call.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from harness.core.job import Job
from harness.core.run import RunMeta
from harness.envs.provider import Provider
from harness.matrix.config import Matrix
from harness.matrix.plan import Plan

# --fresh: None takes unchanged cells from the store; "latency": all but passing ones (those run
# again, for a fresh timing); "all": every cell runs.
FRESH_ALL, FRESH_LATENCY = "all", "latency"
FRESH_MODES = (None, FRESH_LATENCY, FRESH_ALL)


@dataclass(frozen=True)
class RunRequest:
    """A plan to run into one run directory.

    ``output``: the run directory (None: a new one in the store ``reports``); ``resume``: continue
    the newest unfinished run of this matrix (or ``output``); ``jobs``: verdict workers at once
    (None: the matrix's ``jobs``, else one per core); ``fresh``: None takes unchanged cells from
    the store (the cell cache), ``"latency"`` too but runs cached passing cells again, ``"all"``
    (the default: the gate's re-measurements are never served from the store) runs every cell;
    ``meta_extra``: entries of run.json known before the run starts (``shard``); ``keep_spool``:
    keep each passing group's exported file and feeds in ``<run>/spool/<gid>/`` after the run (the
    gate times them interleaved, ``harness.gate.retime``)."""

    matrix: Matrix
    config_path: Path
    plan: Plan
    reports: Path
    output: Path | None = None
    provider: "str | Provider" = "venv"
    resume: bool = False
    force_resume: bool = False
    jobs: int | None = None
    fresh: str | None = FRESH_ALL
    verbose: bool = False
    meta_extra: Mapping[str, Any] = field(default_factory=dict)
    keep_spool: bool = False


@dataclass(frozen=True)
class Limits:
    """What containment enforces per worker: the timeout rule's budget, the memory limit of its
    process tree (None: none) and each log's cap (None: uncapped)."""

    cell_timeout_s: float
    memory_mb: int | None = None
    log_max_mb: float | None = None

    @property
    def log_max_bytes(self) -> int | None:
        return int(self.log_max_mb * 2 ** 20) if self.log_max_mb else None


@dataclass(frozen=True)
class RunContext:
    """One run under way. ``job`` is the worker's job less its environment, groups and phase
    (each supervisor fills those); ``meta`` the run's metadata, written while the run is
    unfinished (``write_meta``, from any thread); ``stop`` set when the runner stops."""

    job: Job
    provider: Provider
    limits: Limits
    meta: RunMeta | None = None
    request: RunRequest | None = None
    jobs: int = 1
    stop: threading.Event = field(default_factory=threading.Event, compare=False)
    meta_lock: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    @property
    def run_id(self) -> str:
        return self.job.run_id

    @property
    def run_dir(self) -> Path:
        return Path(self.job.run_dir)

    @property
    def fresh(self) -> str | None:
        return self.request.fresh if self.request is not None else FRESH_ALL

    def write_meta(self) -> None:
        if self.meta is not None:
            with self.meta_lock:
                self.meta.write(self.run_dir)
