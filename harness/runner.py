"""Execute a plan: realise each environment, supervise its worker, append records durably.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.envs import EnvironmentBuildError
from harness.plan import Cell, EnvPlan, Plan
from harness.records import Record, Status


@dataclass
class WorkerOutcome:
    records: list[Record] = field(default_factory=list)
    restarts: int = 0


def _base_record(run_id: str, cell: Cell, env: str, status: Status, **kw: Any) -> Record:
    return Record(run_id=run_id, case=cell.case, torch=cell.torch, exporter=cell.exporter,
                  opset=cell.opset, runtime=cell.runtime, status=status.value, cell_id=cell.cell_id,
                  env=env, options=cell.options, finished_at=time.time(), **kw)


class WorkerSupervisor:
    """Runs one environment's groups in a worker process, restarting it after a crash or hang."""

    def __init__(self, provider, env_plan: EnvPlan, run_id: str, run_dir: Path, job_extra: dict[str, Any],
                 cell_timeout_s: float, on_record: Callable[[Record], None],
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.provider, self.env_plan = provider, env_plan
        self.run_id, self.run_dir = run_id, run_dir
        self.job_extra, self.cell_timeout_s = job_extra, cell_timeout_s
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

    def _run_worker(self, groups: list[dict[str, Any]], attempt: int) -> set[str]:
        spec = self.env_plan.env
        jobs = self.run_dir / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        job_path = jobs / f"{spec.name}-{attempt}.json"
        job = {"run_id": self.run_id, "run_dir": str(self.run_dir), "env": spec.name,
               "groups": groups, **self.job_extra}
        job_path.write_text(json.dumps(job, indent=1))
        read_fd, write_fd = os.pipe()
        log = open(self.run_dir / "logs" / f"worker-{spec.name}.log", "ab")
        cmd = [*self.provider.worker_command(spec), "--job", str(job_path), "--events-fd", str(write_fd)]
        proc = subprocess.Popen(cmd, pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT,
                                env=self.provider.worker_env(spec, self.job_extra.get("threads", 1)),
                                start_new_session=True)
        os.close(write_fd)
        done: set[str] = set()
        group_by_id = {g["gid"]: g for g in groups}
        current_group: dict[str, Any] | None = None
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
                c["cell_id"] for c in current_group["cells"] if c["cell_id"] not in done]
            stage = "export" if not current_cell else None
            log_path = self.run_dir / "logs" / f"{current_group['gid']}.log"
            for cid in victims:
                rec = _base_record(self.run_id, self.cells[cid], spec.name, outcome,
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
    return [_base_record(run_id, c, env_plan.env.name, Status.CRASH, stage=None,
                         error=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500],
                         notes=["\n".join(msg[-10:])]) for c in cells]


def skip_records(run_id: str, env_plan: EnvPlan, cells: list[Cell], reason: str) -> list[Record]:
    return [_base_record(run_id, c, env_plan.env.name, Status.SKIP, reason=reason,
                         error=None) for c in cells]


def plan_needs(plan: Plan, done: set[str]) -> list[tuple[EnvPlan, list[Cell]]]:
    return [(e, [c for c in e.cells if c.cell_id not in done]) for e in plan.environments]
