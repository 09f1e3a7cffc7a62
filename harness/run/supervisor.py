"""The worker supervisor: runs one environment's export groups in a worker process.

Whatever a case does, the run goes on and every planned cell gets exactly one record:

- each export group runs in a fresh process forked from the worker (``harness.worker.group_process``);
  a group's process that dies ends the worker the same way, so what follows holds per group;
- a worker that ends without its last event (``bye``): killed by a signal, or exited with any
  code (a case calling ``sys.exit(0)`` or ``os._exit(0)``), or one that sends an unreadable
  event, is a death of the cell it was on (of the group's remaining cells before the first
  cell, charged to the stage the group said it was in: reference, export or check). The
  cell is retried in a fresh worker; a cell that kills ``MAX_DEATHS_PER_CELL`` workers is recorded
  as ``crash``, and the run moves on (no endless restarts);
- a worker that dies before it starts a group ran no case code: killed by a signal (the kernel's
  OOM killer during ``import torch`` on a busy machine) it is retried, nothing charged, up to
  ``MAX_STARTUP_KILLS`` in a row; one that exits by itself (an import error) or is killed that
  often means the environment is broken (its cells: ``EnvironmentBuildError``);
- a worker that makes no progress (no event) for ``cell_timeout_s`` is killed and the cell is
  ``timeout``, judged by the cell's own progress (``Progress``): a cell its processes keep busy
  gets ``cell_timeout_s`` of CPU time (a starved cell on a loaded machine is not cut short), one
  whose processes use no CPU (hung) ends at ``cell_timeout_s`` of wall time, and none runs past
  ``TIMEOUT_WALL_FACTOR`` times it; the record keeps both times (``wall_s``, ``cpu_s``);
- a worker whose process tree holds more than ``cell_memory_mb`` of resident memory (polled with
  psutil) is killed and the cell is ``crash`` with the error ``MemoryLimit: ...``;
- processes a case leaves behind (``os.fork``, daemons, a child holding the worker's pipes) are
  killed after each group (by the worker, a child subreaper, before it forks the next group; by
  the runner for a worker that runs groups in place) and when the worker ends: every process of
  the worker's tree and every
  process carrying the worker's token in its environment (which survives re-parenting and
  ``setsid``). A forked process never sends an event (the worker checks its pid; the supervisor
  also drops events from any other pid), so no record is written twice;
- the worker's stdout/stderr come through a pipe: each log keeps its first and last
  ``log_max_mb / 2`` (``LogRelay``), and a bundle gets the capped log.

Each worker runs in its own session (process group): killing it kills its group.

Several workers may run one environment's groups at once (``EnvWork``: the environment's queue
of groups, shared by the supervisors of the runner's slots, with each cell's deaths): a venv
worker asks for the next group when it is free (``--groups-fd``), a container gets all the
groups left when it starts. A group a dead worker leaves unfinished goes back to the front of
the queue, restricted to its cells without a record.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, Callable

from harness.core.events import (
    EVENT_TYPES,
    Bye,
    CellStart,
    EventError,
    GroupStart,
    Hello,
    RecordDone,
    StageStart,
    Want,
    WorkerEvent,
    event_from_dict,
)
from harness.core.job import ExportGroup
from harness.core.record import Record, SchemaError
from harness.core.status import Stage, Status
from harness.core.wire import LOG_MAX_ENV, RELAY_ENV, RUNNER_PID_ENV, TOKEN_ENV
from harness.envs.provider import EnvironmentBuildError, local_worker
from harness.matrix.plan import Cell, EnvPlan
from harness.run.context import RunContext
from harness.run.logrelay import LogRelay
from harness.run.processes import kill_session, reap, remove_scratch, tree_cpu, tree_rss
from harness.run.runner_records import planned_record
from harness.run.timeouts import Death, Progress
from harness.run.workqueue import EnvWork

MAX_DEATHS_PER_CELL = 2      # a cell that kills this many workers is recorded as `crash`
MEMORY_POLL_S = 0.25         # how often the worker tree's resident memory is read
BYE_GRACE_S = 10.0           # a worker that said bye but does not exit (a case's thread) is killed
DRAIN_S = 2.0                # how long output of dead processes is read after the worker ended
MIB = 2 ** 20
_WORKER_SEQ = count(1)       # job file names: unique per runner, also with workers in parallel


class Stopped(Exception):
    """The runner is stopping (a signal): the worker was killed, nothing is recorded for it."""


@dataclass
class AttemptState:
    groups: dict[str, ExportGroup]
    pid: int | None = None
    group: ExportGroup | None = None
    cell: str | None = None
    done: set[str] = field(default_factory=set)
    bye: bool = False
    groups_started: int = 0
    bundles: dict[str, list[Path]] = field(default_factory=dict)   # gid → bundle dirs
    feed: Callable[[], list[ExportGroup]] | None = None     # more groups (a family) on "want"
    groups_w: int | None = None                                    # the pipe they go down
    relay: Any = None
    fresh: bool = False           # the worker forks a process per group and cleans up after it
    child: int | None = None      # the pid of the current group's process
    family: int | None = None     # the pid of the family's process that forked it (capture reuse)
    stage: str | None = None      # the stage the group (or its current cell) is in
    progress: Any = None          # the timeout rule's clock (``Progress``)
    started: float | None = None  # time.time() before the worker was started (``reap``'s ``since``)
    scratch: str | None = None    # the worker's scratch folder, from its hello (``remove_scratch``)


class WorkerSupervisor:
    """Runs one environment's groups in a worker process, restarting it after a crash or hang."""

    def __init__(self, ctx: RunContext, env_plan: EnvPlan, on_record: Callable[[Record], None],
                 on_event: Callable[[WorkerEvent], None] | None = None, work: EnvWork | None = None,
                 worker_log: str | None = None, phase: str | None = None) -> None:
        """``ctx`` the run (its job, provider, limits, stop signal); the job's environment and
        ``phase`` are this supervisor's, its groups filled per attempt; ``work`` is the
        environment's shared queue (``run_shared``); ``worker_log`` names the log of the worker's
        own output. ``ctx.stop`` ends the worker and raises ``Stopped``."""
        self.ctx, self.provider, self.env_plan = ctx, ctx.provider, env_plan
        self.job = ctx.job.replace(env=env_plan.env.name, **({"phase": phase} if phase else {}))
        self.run_id, self.run_dir = self.job.run_id, Path(self.job.run_dir)
        self.cell_timeout_s = ctx.limits.cell_timeout_s
        self.on_record = on_record
        self.on_event = on_event or (lambda e: None)
        self.cells = {c.cell_id: c for c in env_plan.cells}
        self.memory_limit_mb = ctx.limits.memory_mb or None
        self.log_max_bytes = ctx.limits.log_max_bytes
        # A venv worker is a process tree of ours; a container's processes are Docker's (removed
        # with the container), and its worker writes group logs itself (capped in the worker).
        self.owns_tree = local_worker(self.provider, env_plan.env)
        self.work = work or EnvWork(env_plan)
        self.deaths = self.work.deaths
        self.stop = ctx.stop
        self.worker_log = worker_log or f"worker-{env_plan.env.name}.log"

    def run(self, cells: list[Cell]) -> int:
        """Run ``cells`` (each worker gets every group left); returns the number of worker restarts."""
        pending = [c.cell_id for c in cells]
        restarts = 0
        while pending:
            groups = self.env_plan.groups([self.cells[cid] for cid in pending])
            done, _ = self._run_worker(groups, next(_WORKER_SEQ))
            pending = [cid for cid in pending if cid not in done]
            if pending:
                restarts += 1
        return restarts

    def run_shared(self) -> None:
        """Run groups from the environment's shared queue until it is empty: a venv worker asks
        for one group at a time, so that every free slot takes part; a group a worker left
        unfinished goes back to the queue (the cells it settled stay settled). Raises
        ``EnvironmentBuildError`` when a worker dies before running any cell (the caller records
        the environment's remaining cells) and ``Stopped`` when the runner stops."""
        pull = self.owns_tree
        while True:
            if self.stop is not None and self.stop.is_set():
                raise Stopped()
            first = self.work.take_family()
            if not first:
                return
            groups = first if pull else [*first, *self.work.take_all()]
            self._state = None
            try:
                done, handed = self._run_worker(groups, next(_WORKER_SEQ), feed=self.work.take_family if pull else None)
            except Stopped:
                raise
            except BaseException:
                state = self._state
                handed = list(state.groups.values()) if state else groups
                self.work.give_back(self._unfinished(handed, state.done if state else set()))
                raise
            self.work.give_back(self._unfinished(handed, done))

    def _unfinished(self, groups: list[ExportGroup], done: set[str]) -> list[ExportGroup]:
        cells = [self.cells[c.cell_id] for g in groups for c in g.cells if c.cell_id not in done]
        return self.env_plan.groups(cells) if cells else []

    # -- one worker process ---------------------------------------------------------------

    def _run_worker(self, groups: list[ExportGroup], attempt: int,
                    feed: Callable[[], list[ExportGroup]] | None = None) -> tuple[set[str], list[ExportGroup]]:
        """One worker process on ``groups`` (and, with ``feed``, the groups it asks for): the
        cells it settled (recorded, or charged for its death) and every group it was given."""
        spec = self.env_plan.env
        jobs = self.run_dir / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        job_path = self.job.replace(groups=tuple(groups)).write(jobs / f"{spec.name}-{attempt}.json")
        state = AttemptState({g.gid: g for g in groups}, feed=feed)
        self._state = state
        token, nonce = secrets.token_hex(8), secrets.token_hex(4)
        env = {**self.provider.worker_env(spec, self.job.threads), TOKEN_ENV: token}
        if self.log_max_bytes:
            env[LOG_MAX_ENV] = str(self.log_max_bytes)
        if self.owns_tree:
            env[RELAY_ENV] = nonce
            # Die with the runner: a venv worker is our child. A container's worker is the child
            # of the container's init (the variable would reach it, and it would exit at once).
            env[RUNNER_PID_ENV] = str(os.getpid())
        relay = LogRelay(logs / self.worker_log, logs, self.log_max_bytes, nonce,
                         set(state.groups), lambda gid: self._group_log_closed(state, relay, gid))
        state.relay = relay
        events_r, events_w = os.pipe()
        out_r, out_w = os.pipe()
        fds = [events_r, events_w, out_r, out_w]
        cmd = [*self.provider.worker_command(spec), "--job", str(job_path), "--events-fd", str(events_w)]
        passed = [events_w]
        if feed is not None:
            groups_r, state.groups_w = os.pipe()
            fds += [groups_r, state.groups_w]
            passed.append(groups_r)
            cmd += ["--groups-fd", str(groups_r)]
        state.started = time.time()
        try:
            proc = subprocess.Popen(cmd, pass_fds=tuple(passed), stdin=subprocess.DEVNULL, stdout=out_w,
                                    stderr=out_w, env=env, start_new_session=True)
        except BaseException:
            for fd in fds:
                os.close(fd)
            relay.close()
            raise
        for fd in (*passed, out_w):
            os.close(fd)
        death: Death | None = None
        try:
            death = self._supervise(proc, events_r, out_r, relay, state, token)
        finally:
            self._end_worker(proc, state, token, out_r, relay)
            os.close(events_r)
            os.close(out_r)
            if state.groups_w is not None:
                with contextlib.suppress(OSError):
                    os.close(state.groups_w)
        handed = list(state.groups.values())
        if death is None:
            missing = [c.cell_id for g in handed for c in g.cells if c.cell_id not in state.done]
            if not missing:
                return state.done, handed
            death = Death(Status.CRASH, "Crash: worker ended without running every cell")
        with self.work.lock:
            self.work.early_ends += 1
        self._blame(death, handed, state)
        return state.done, handed

    def _supervise(self, proc: subprocess.Popen, events_r: int, out_r: int, relay: LogRelay,
                   state: AttemptState, token: str) -> Death | None:
        """Read events and output until the worker says bye (None) or ends early (a Death)."""
        progress = Progress(self.cell_timeout_s, (lambda: tree_cpu(proc.pid)) if self.owns_tree else None)
        progress.reset(extra_s=120)   # the first covers imports
        state.progress = progress
        next_poll = 0.0
        watch = {events_r, out_r}
        buf = b""
        while True:
            if self.stop is not None and self.stop.is_set():
                raise Stopped()
            now = time.monotonic()
            timeout = progress.poll()
            if timeout is not None:
                return timeout
            if self.memory_limit_mb and now >= next_poll and self.owns_tree:
                next_poll = now + MEMORY_POLL_S
                limit = self.memory_limit_mb * MIB
                rss = tree_rss(proc.pid, limit)
                if rss > limit:
                    return Death(Status.CRASH, f"MemoryLimit: the worker's processes reached "
                                 f"{rss / MIB:.0f} MiB, over cell_memory_mb={self.memory_limit_mb}",
                                 final=True)
            ready, _, _ = select.select(list(watch), [], [], MEMORY_POLL_S)
            events_closed = False
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if fd == out_r:
                    if chunk:
                        relay.feed(chunk)
                    else:
                        watch.discard(out_r)
                    continue
                if not chunk:
                    watch.discard(events_r)
                    events_closed = True
                    continue
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    problem = self._event(line, state, proc.pid, token)
                    if problem:
                        return Death(Status.CRASH, f"Crash: {problem}")
                    progress.reset()
            if state.bye:
                return None
            if events_closed or proc.poll() is not None:
                # Gone (or its events pipe closed) without its last event: read what it sent.
                if not events_closed:
                    buf = self._drain_events(events_r, buf, state, proc.pid, token)
                if state.bye:
                    return None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)   # the pipe closes a moment before the exit is seen
                return Death(Status.CRASH, f"Crash: {exit_reason(proc)}", killed=(proc.poll() or 0) < 0)

    def _drain_events(self, fd: int, buf: bytes, state: AttemptState, pid: int, token: str) -> bytes:
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if self._event(line, state, pid, token):
                    return buf
        return buf

    def _event(self, line: bytes, state: AttemptState, worker_pid: int, token: str) -> str | None:
        """Apply one event; a protocol problem (the worker cannot be trusted further) as a string."""
        try:
            data = json.loads(line)
        except ValueError:
            return f"worker sent an unreadable event ({line[:80]!r})"
        if not isinstance(data, dict):
            return f"worker sent an unreadable event ({line[:80]!r})"
        if data.get("event") not in EVENT_TYPES:
            return None               # a kind this runner does not know: never counted
        try:
            event = event_from_dict(data)
        except EventError as exc:
            return f"worker sent an unreadable event ({exc})"
        pid = event.pid
        if isinstance(event, Hello) and state.pid is None:
            state.pid, state.fresh, state.scratch = pid, event.fresh, event.scratch
        elif isinstance(event, GroupStart) and state.fresh and pid is not None and \
                event.parent is not None and event.parent == state.pid:
            state.child, state.family = pid, None   # a group's (or a family's) process, forked by the worker
        elif isinstance(event, GroupStart) and state.fresh and pid is not None and \
                event.parent is not None and event.parent in (state.child, state.family):
            # a group's process forked by its family's process (a capture shared across opsets)
            state.family, state.child = event.parent, pid
        elif pid is not None and state.pid is not None and pid not in (state.pid, state.child, state.family):
            return None   # from a process a case forked: never counted
        if isinstance(event, GroupStart):
            group = state.groups.get(event.gid)
            if group is None:
                return f"worker started an unknown group {event.gid!r}"
            if state.groups_started and self.owns_tree and not state.fresh:
                reap(worker_pid, token, keep={worker_pid}, since=state.started)   # what the previous group left behind
            state.groups_started += 1
            state.group, state.cell, state.stage = group, None, None
            with self.work.lock:
                self.work.startup_deaths = 0     # a worker of this environment got going
        elif isinstance(event, StageStart):
            state.stage = event.stage
        elif isinstance(event, CellStart):
            cid = event.cell_id
            if state.group is None or cid not in {c.cell_id for c in state.group.cells}:
                return f"worker started cell {cid!r} outside its group"
            state.cell, state.stage = cid, None
        elif isinstance(event, RecordDone):
            try:
                rec = Record.from_dict(event.record)
            except SchemaError as exc:
                return f"worker sent an invalid record: {exc}"
            if rec.cell_id in state.done or rec.cell_id not in self.cells:
                return None   # a record twice (or a foreign one) is never written
            if self.deaths.get(rec.cell_id):
                rec.notes.append(f"{len(self.deaths[rec.cell_id])} earlier worker(s) died on this "
                                 f"cell ({'; '.join(self.deaths[rec.cell_id])}); this is the "
                                 "result of a fresh worker")
            state.done.add(rec.cell_id)
            state.cell, state.stage = None, None
            self.on_record(rec)
            if rec.bundle and state.group is not None:
                state.bundles.setdefault(state.group.gid, []).append(Path(rec.bundle))
        elif isinstance(event, Want):
            self._hand_out(state)
        elif isinstance(event, Bye):
            state.bye = True
        self.on_event(event)
        return None

    def _hand_out(self, state: AttemptState) -> None:
        """Answer a worker's ``want``: the environment's next group, or null (then no more)."""
        if state.groups_w is None:
            return
        family = state.feed() if state.feed is not None else None
        for group in family or ():
            state.groups[group.gid] = group
            if state.relay is not None:
                state.relay.known.add(group.gid)
        line = (json.dumps([g.to_dict() for g in family]) if family else "null") + "\n"
        try:
            data = line.encode()
            while data:
                data = data[os.write(state.groups_w, data):]
        except OSError:
            pass            # the worker is gone: its death is seen on the events pipe
        if not family:
            with contextlib.suppress(OSError):
                os.close(state.groups_w)
            state.groups_w = None

    def _group_log_closed(self, state: AttemptState, relay: LogRelay, gid: str) -> None:
        """Bundles get the group's final, capped log (the worker copied it mid-way)."""
        for bundle in state.bundles.pop(gid, []):
            with contextlib.suppress(OSError):
                shutil.copyfile(relay.log_dir / f"{gid}.log", bundle / "cell.log")

    def _end_worker(self, proc: subprocess.Popen, state: AttemptState, token: str, out_r: int,
                    relay: LogRelay) -> None:
        """Make sure the worker and everything it started are gone; finish its logs."""
        if proc.poll() is None and state.bye:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=BYE_GRACE_S)
        kill_session(proc.pid)   # its session: the worker and what stayed in it
        proc.wait()
        if self.owns_tree:
            reap(proc.pid, token, since=state.started)
            remove_scratch(state.scratch)   # a worker killed mid-group never removed it
        # Everything that could write to the output pipe is dead: read it to its end.
        end = time.monotonic() + DRAIN_S
        while time.monotonic() < end and select.select([out_r], [], [], max(0.0, end - time.monotonic()))[0]:
            chunk = os.read(out_r, 1 << 16)
            if not chunk:
                break
            relay.feed(chunk)
        relay.close()
        for gid in list(state.bundles):
            self._group_log_closed(state, relay, gid)

    def _startup_death_retried(self, death: Death, group: ExportGroup | None) -> bool:
        """Whether a worker that died before starting any group is retried: it was killed by a
        signal (not an exit of its own), and fewer than MAX_STARTUP_KILLS in a row were."""
        if group is None or not death.killed or death.final:
            return False
        with self.work.lock:
            self.work.startup_deaths += 1
            return self.work.startup_deaths < MAX_STARTUP_KILLS

    def _blame(self, death: Death, groups: list[ExportGroup], state: AttemptState) -> None:
        """Charge a dead worker to the cell it was on, or to its group's remaining cells during
        the export; a cell charged MAX_DEATHS_PER_CELL times (or once for a final death) gets its
        record now, the others are retried by the next worker."""
        spec = self.env_plan.env
        if state.cell:
            # the stage of the cell it was in (load, run, parity, latency), when it said so
            group, victims, stage = state.group, [state.cell], _cell_stage(state.stage)
        else:
            def undone(g: ExportGroup | None) -> bool:
                return g is not None and any(c.cell_id not in state.done for c in g.cells)

            group = state.group if undone(state.group) else next(filter(undone, groups), None)
            if group is None or (state.group is None and not state.done):
                # The worker died before starting any group. Killed by a signal (an OOM kill during
                # `import torch`): nothing of a case ran, so nothing is charged; its groups go back
                # to the queue for a fresh worker. Ended by itself (an import that fails, a broken
                # interpreter), or killed at start-up MAX_STARTUP_KILLS times in a row: the
                # environment is broken.
                if self._startup_death_retried(death, group):
                    return
                kills = f"; {self.work.startup_deaths} workers in a row were killed while starting" \
                    if death.killed and self.work.startup_deaths > 1 else ""
                raise EnvironmentBuildError(
                    f"worker for {spec.name} ended before running a cell ({death.why}{kills}); see "
                    f"{self.run_dir / 'logs' / self.worker_log}")
            victims = [c.cell_id for c in group.cells if c.cell_id not in state.done]
            # The group's stage it died in (reference, export, check); a worker that names none
            # (an older one) died in the export, the one long step before a cell's first event.
            stage = state.stage if group is state.group and state.stage in GROUP_STAGES else \
                Stage.REFERENCE.value if state.fresh else Stage.EXPORT.value
        log_path = self.run_dir / "logs" / f"{group.gid}.log"
        for cid in victims:
            deaths = self.deaths.setdefault(cid, [])
            deaths.append(death.why)
            if not death.final and len(deaths) < MAX_DEATHS_PER_CELL:
                continue
            notes = [f"{len(deaths)} workers died on this cell: {'; '.join(deaths)}"] if len(deaths) > 1 else []
            rec = planned_record(self.run_id, self.cells[cid], spec.name, death.status, stage=stage,
                                 error=death.why, log=str(log_path), notes=notes,
                                 wall_s=death.wall_s, cpu_s=death.cpu_s)
            state.done.add(cid)
            self.on_record(rec)


GROUP_STAGES = (Stage.REFERENCE.value, Stage.EXPORT.value, Stage.CHECK.value, Stage.STEP.value)
# Workers of one environment killed by a signal while starting (an OOM kill during `import
# torch`), one after the other, before the environment counts as broken; fewer are retried.
MAX_STARTUP_KILLS = 3


def _cell_stage(stage: str | None) -> str | None:
    return stage if stage in {s.value for s in Stage} and stage not in GROUP_STAGES else None


def exit_reason(proc: subprocess.Popen) -> str:
    code = proc.poll()
    if code is None:
        return "worker closed its events pipe"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"worker killed by signal {signal.Signals(-code).name}"
        return f"worker killed by signal {-code}"
    return (f"worker exited with code {code} before its last event (did the case call sys.exit() "
            "or os._exit()?)")

