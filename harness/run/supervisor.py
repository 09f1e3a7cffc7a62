"""The worker supervisor: runs one environment's export groups in a worker process.

A worker that crashes (segfault, abort) or hangs past the per-cell timeout is killed; the cell it
was on becomes a `crash` / `timeout` record and a fresh worker continues with the next cell.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from harness.core.job import ExportGroup, Job
from harness.core.record import Record
from harness.core.status import Stage, Status
from harness.envs.provider import EnvironmentBuildError, Provider
from harness.matrix.plan import Cell, EnvPlan, Plan


def planned_record(run_id: str, cell: Cell, env: str, status: Status, **kw: Any) -> Record:
    """A record the runner writes itself (skip, crash, timeout, environment failure)."""
    return Record.for_cell(run_id, cell.key, cell.torch, env, status, **kw)


class WorkerSupervisor:
    """Runs one environment's groups in a worker process, restarting it after a crash or hang."""

    def __init__(self, provider: Provider, env_plan: EnvPlan, job: Job, cell_timeout_s: float,
                 on_record: Callable[[Record], None],
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``job`` carries everything but the groups, which the supervisor fills per attempt."""
        self.provider, self.env_plan, self.job = provider, env_plan, job
        self.run_id, self.run_dir = job.run_id, Path(job.run_dir)
        self.cell_timeout_s = cell_timeout_s
        self.on_record = on_record
        self.on_event = on_event or (lambda e: None)
        self.cells = {c.cell_id: c for c in env_plan.cells}

    def run(self, cells: list[Cell]) -> int:
        """Run ``cells``; returns the number of worker restarts."""
        pending = [c.cell_id for c in cells]
        restarts = 0
        attempt = 0
        while pending:
            attempt += 1
            groups = self.env_plan.groups([self.cells[cid] for cid in pending])
            done = self._run_worker(groups, attempt)
            pending = [cid for cid in pending if cid not in done]
            if pending:
                restarts += 1
        return restarts

    def _run_worker(self, groups: list[ExportGroup], attempt: int) -> set[str]:
        spec = self.env_plan.env
        jobs = self.run_dir / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        job_path = self.job.replace(groups=tuple(groups)).write(jobs / f"{spec.name}-{attempt}.json")
        read_fd, write_fd = os.pipe()
        log = open(self.run_dir / "logs" / f"worker-{spec.name}.log", "ab")
        cmd = [*self.provider.worker_command(spec), "--job", str(job_path), "--events-fd", str(write_fd)]
        proc = subprocess.Popen(cmd, pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT,
                                env=self.provider.worker_env(spec, self.job.threads),
                                start_new_session=True)
        os.close(write_fd)
        done: set[str] = set()
        group_by_id = {g.gid: g for g in groups}
        current_group: ExportGroup | None = None
        current_cell: str | None = None
        buf = b""
        deadline = time.monotonic() + self.cell_timeout_s + 120  # first deadline covers imports
        outcome: Status | None = None
        try:
            while True:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    outcome = Status.TIMEOUT
                    break
                ready, _, _ = select.select([read_fd], [], [], min(wait, 1.0))
                if not ready:
                    continue
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    proc.wait()
                    outcome = None if proc.returncode == 0 else Status.CRASH
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    event = json.loads(line)
                    deadline = time.monotonic() + self.cell_timeout_s
                    kind = event.get("event")
                    if kind == "group_start":
                        current_group, current_cell = group_by_id[event["gid"]], None
                    elif kind == "cell_start":
                        current_cell = event["cell_id"]
                    elif kind == "record":
                        rec = Record.from_dict(event["record"])
                        done.add(rec.cell_id)
                        current_cell = None
                        self.on_record(rec)
                    self.on_event(event)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            os.close(read_fd)
            log.close()
        if outcome is not None and current_group is not None:
            if outcome is Status.CRASH and proc.returncode is not None and proc.returncode < 0:
                why = f"worker killed by signal {signal.Signals(-proc.returncode).name}"
            elif outcome is Status.CRASH:
                why = f"worker exited with code {proc.returncode}"
            else:
                why = f"no progress within {self.cell_timeout_s:g} s"
            # A crash in the export (no cell started yet) takes every cell of the group with it.
            victims = [current_cell] if current_cell else [
                c.cell_id for c in current_group.cells if c.cell_id not in done]
            stage = Stage.EXPORT.value if not current_cell else None
            log_path = self.run_dir / "logs" / f"{current_group.gid}.log"
            for cid in victims:
                rec = planned_record(self.run_id, self.cells[cid], spec.name, outcome,
                                     stage=stage, error=f"{outcome.value.capitalize()}: {why}",
                                     log=str(log_path))
                done.add(cid)
                self.on_record(rec)
        elif outcome is not None and not done:
            # The worker died before starting any group: the environment itself is broken.
            raise EnvironmentBuildError(
                f"worker for {spec.name} {'timed out' if outcome is Status.TIMEOUT else 'died'} "
                f"before running a cell; see {self.run_dir / 'logs' / f'worker-{spec.name}.log'}")
        return done


def environment_failure_records(run_id: str, env_plan: EnvPlan, cells: list[Cell], exc: Exception) -> list[Record]:
    msg = str(exc).strip().splitlines()
    return [planned_record(run_id, c, env_plan.env.name, Status.CRASH, stage=None,
                           error=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500],
                           notes=["\n".join(msg[-10:])]) for c in cells]


def skip_records(run_id: str, env_plan: EnvPlan, cells: list[Cell], reason: str) -> list[Record]:
    return [planned_record(run_id, c, env_plan.env.name, Status.SKIP, reason=reason) for c in cells]


def plan_needs(plan: Plan, done: set[str]) -> list[tuple[EnvPlan, list[Cell]]]:
    return [(e, [c for c in e.cells if c.cell_id not in done]) for e in plan.environments]
