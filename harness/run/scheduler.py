"""The scheduler: a plan's cells, verdicts in parallel slots, then latency alone."""
from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from rich.markup import escape

from harness.console import console
from harness.core.events import CellStart, WorkerEvent
from harness.core.job import PHASE_LATENCY, LatencyProtocol
from harness.core.record import Record
from harness.core.status import Status
from harness.envs.provider import EnvironmentBuildError, cannot_create
from harness.matrix.plan import Cell, EnvPlan, Plan
from harness.run.confirm import confirm
from harness.run.context import FRESH_LATENCY, RunContext
from harness.run.processes import end_child_processes
from harness.run.results_writer import ResultsWriter
from harness.run.runner_records import environment_failure_records, planned_record, skip_records
from harness.run.supervisor import Stopped, WorkerSupervisor
from harness.run.workqueue import EnvWork
from harness.store.cache import CellCache, KeyContext, adopt

# How long a free slot waits for an environment still being prepared before it joins one another
# worker already works on: an installed environment is checked in about 3 s, while a second worker
# of one environment spends 15 s of CPU importing torch and torch.export again (2-core machine).
JOIN_GRACE_S = 10.0


def plan_needs(plan: Plan, done: set[str]) -> list[tuple[EnvPlan, list[Cell]]]:
    """Per environment of the plan, its cells not yet recorded (``done``)."""
    return [(e, [c for c in e.cells if c.cell_id not in done]) for e in plan.environments]


class Scheduler:
    """Runs a plan in two phases.

    **Verdicts**, in parallel: ``jobs`` slots (threads), each supervising one worker process at a
    time. Environments are prepared one after the other in the background (downloads overlap the
    workers); as each becomes ready its cells are looked up in the cell cache and the rest queued
    as export groups (``EnvWork``). A free slot takes the environment nobody works on yet, else
    the one with the most groups left, and its worker pulls that environment's groups one at a
    time: two workers of one environment run different groups. While environments are still being
    prepared, a slot that would only be the second on one waits up to ``JOIN_GRACE_S`` for one of
    them first (a second worker pays its imports again). Passing verdicts are held.

    **Latency**, serially, once every verdict worker has ended and every environment is ready:
    one latency worker per environment times the held cells' spooled files, nothing else running
    on the machine's behalf, so no timing is ever taken beside an export. (An exclusive lock
    around the latency stage would pause every other worker for each of hundreds of sub-second
    timings and leave their state in memory; the phase costs one model load per passing cell and
    one worker start per environment.) A second latency worker per environment times each cell
    again with a short protocol, and cells whose two figures disagree are timed in a few more
    before their records are written (``harness.run.confirm``).

    Containment is the supervisor's, per worker, in both phases; an interrupt stops every slot
    (``Stopped``: its worker killed, nothing recorded for it) and ends the run resumable."""

    def __init__(self, ctx: RunContext, writer: ResultsWriter, cache: CellCache | None, keys: KeyContext) -> None:
        self.ctx, self.writer, self.cache, self.key_context = ctx, writer, cache, keys
        self.provider, self.job, self.meta, self.stop = ctx.provider, ctx.job, ctx.meta, ctx.stop
        self.cond = threading.Condition()
        self.works: dict[str, EnvWork] = {}
        self.assigned: dict[str, int] = {}
        self.envs_settled = False
        self.errors: list[BaseException] = []
        self.latency_works: list[EnvWork] = []
        writer.died = lambda cid: any(cid in w.deaths for w in [*self.works.values(), *self.latency_works])

    # -- the whole run ------------------------------------------------------------------------
    def run(self, todo: list[tuple[EnvPlan, list[Cell]]]) -> None:
        t0 = time.monotonic()
        skip_reason = {e.env.name: self.provider.skip_reason(e.env) for e, _ in todo}
        for env_plan, cells in todo:
            if why := skip_reason[env_plan.env.name]:
                self.writer.verdicts(skip_records(self.meta.run_id, env_plan, cells, why))
        build = [(e, self._without_absent(e, c)) for e, c in todo if not skip_reason[e.env.name]]
        # Environments are prepared one after the other in a background thread: downloading and
        # installing the next torch (network and disk bound) overlaps the workers (CPU bound).
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-prefetch")
        slots = [threading.Thread(target=self._slot, args=(i,), name=f"slot-{i}", daemon=True)
                 for i in range(1, self.ctx.jobs + 1)]
        try:
            futures = {pool.submit(self.provider.ensure, e.env): (e, c) for e, c in build}
            for thread in slots:
                thread.start()
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._env_ready(*futures[future], future)
                self._raise_slot_error()
            with self.cond:
                self.envs_settled = True
                self.cond.notify_all()
            for thread in slots:
                while thread.is_alive():
                    thread.join(timeout=0.25)
            self._raise_slot_error()
            t1 = time.monotonic()
            self._latency_phase(build)
            t2 = time.monotonic()
        except BaseException:
            # Interrupted (or broken): every slot ends its worker; no environment install waits.
            self.stop.set()
            with self.cond:
                self.cond.notify_all()
            for thread in slots:
                if thread.is_alive():
                    thread.join(timeout=30)
            pool.shutdown(wait=False, cancel_futures=True)
            end_child_processes()
            raise
        pool.shutdown(wait=True)
        self.meta.extra["schedule"] = {
            "jobs": self.ctx.jobs, "verdict_phase_s": round(t1 - t0, 2), "latency_phase_s": round(t2 - t1, 2),
            "cached": self.writer.cached, "fresh": self.ctx.fresh or "no",
        }
        self.ctx.write_meta()

    def _without_absent(self, env_plan: EnvPlan, cells: list[Cell]) -> list[Cell]:
        """The cells left once those of runtimes the environment lacks (an existing one: see
        ``EnvSpec.absent``) are recorded as skips with the reason; no worker is started for them."""
        absent = env_plan.env.absent
        for label, why in absent.items():
            mine = [c for c in cells if c.key.runtime == label]
            if mine:
                self.writer.verdicts(skip_records(self.meta.run_id, env_plan, mine, why))
        return [c for c in cells if c.key.runtime not in absent]

    def _raise_slot_error(self) -> None:
        if self.errors:
            raise self.errors[0]

    # -- environments --------------------------------------------------------------------------
    def _env_ready(self, env_plan: EnvPlan, cells: list[Cell], future: Any) -> None:
        """An environment is realised (or failed): record what the cache has, queue the rest."""
        env = env_plan.env
        try:
            try:
                marker = future.result()
            except OSError as exc:   # a provider's folder that cannot be made: the same failure
                raise EnvironmentBuildError(cannot_create(env.name, exc)) from exc
        except EnvironmentBuildError as exc:
            # Build logs hold brackets ("[/bin/sh -c ...]") that rich would read as markup.
            console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
            self.writer.verdicts(environment_failure_records(self.meta.run_id, env_plan, cells, exc))
            return
        with self.ctx.meta_lock:
            self.meta.environments[env.name] = marker.to_dict()
            self.ctx.write_meta()
        keys = {c.cell_id: self.key_context.key(c, env, marker) for c in cells}
        self.writer.keys.update(keys)
        hits = (self.cache.lookup({cid: k for cid, k in keys.items() if k}, self.job.base_dir)
                if self.cache else {})
        if self.cache and self.cache.stale:
            changed = sorted({f for files in self.cache.stale.values() for f in files})
            console.print(f"{env.name}: {len(self.cache.stale)} stored cell(s) run again: files their case "
                          f"loaded changed ({', '.join(changed[:5])}{' …' if len(changed) > 5 else ''})",
                          markup=False, highlight=False)
        if self.ctx.fresh == FRESH_LATENCY:   # passing cells run again, for a fresh timing
            hits = {cid: h for cid, h in hits.items() if h[0].status not in (Status.PASS, Status.XPASS)}
        self.writer.from_store([adopt(rec, source, self.meta.run_id, self.ctx.run_dir)
                                  for rec, source in hits.values()])
        rest = [c for c in cells if c.cell_id not in hits]
        if hits:
            console.print(f"{env.name}: {len(hits)} of {len(cells)} cells unchanged, taken from the store",
                          markup=False, highlight=False)
        with self.cond:
            self.works[env.name] = EnvWork(env_plan, env_plan.groups(rest) if rest else [])
            self.assigned[env.name] = 0
            self.cond.notify_all()

    def _env_failed(self, work: EnvWork, exc: EnvironmentBuildError) -> None:
        """A worker of the environment died before running any cell: the environment is broken;
        its cells without a record get its failure (other workers of it finish their groups)."""
        env = work.env_plan.env
        console.print(f"[red]environment {env.name} failed:[/] {escape(str(exc))}")
        with work.lock:
            work.failed = exc
            groups = work.drain()
        cells = [c for c in work.env_plan.cells if c.cell_id in {x.cell_id for g in groups for x in g.cells}]
        self.writer.verdicts(environment_failure_records(self.meta.run_id, work.env_plan, cells, exc))

    # -- verdict slots -------------------------------------------------------------------------
    def _next_work(self) -> EnvWork | None:
        """The environment this slot works on next; None once there is nothing left to start."""
        with self.cond:
            grace_until = time.monotonic() + JOIN_GRACE_S
            while not self.stop.is_set():
                ready = [(name, w) for name, w in self.works.items() if len(w)]
                joining = ready and all(self.assigned[name] > 0 for name, _ in ready)
                if joining and not self.envs_settled and time.monotonic() < grace_until:
                    ready = []    # one more environment may come before the grace ends: wait for it
                elif ready:
                    # Nobody on it yet first (one worker start per environment), then most left.
                    name, work = min(ready, key=lambda nw: (self.assigned[nw[0]] > 0, -len(nw[1]),
                                                             list(self.works).index(nw[0])))
                    self.assigned[name] += 1
                    return work
                if self.envs_settled:
                    return None
                self.cond.wait(timeout=0.25)
        return None

    def _slot(self, index: int) -> None:
        try:
            while (work := self._next_work()) is not None:
                env = work.env_plan.env
                log = f"worker-{env.name}.log" if index == 1 else f"worker-{env.name}-{index}.log"
                sup = WorkerSupervisor(self.ctx, work.env_plan, self.writer.verdict,
                                       on_event=self._on_event, work=work, worker_log=log)
                try:
                    sup.run_shared()
                except EnvironmentBuildError as exc:
                    self._env_failed(work, exc)
                finally:
                    with self.cond:
                        self.assigned[env.name] -= 1
                        self._note_restarts(env.name, work)
                        self.cond.notify_all()
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            self.errors.append(exc)
            self.stop.set()

    def _note_restarts(self, name: str, work: EnvWork) -> None:
        with self.ctx.meta_lock:
            if name in self.meta.environments:
                self.meta.environments[name]["worker_restarts"] = work.early_ends

    def _on_event(self, event: WorkerEvent) -> None:
        if isinstance(event, CellStart):
            self.writer.progress.describe(event.cell_id)

    # -- the latency phase ---------------------------------------------------------------------
    def _latency_phase(self, build: list[tuple[EnvPlan, list[Cell]]]) -> None:
        """Time every held passing cell, one environment after the other, nothing else running;
        each figure checked in a second fresh worker before it is stored (``harness.run.confirm``)."""
        checks = {"checked": 0, "disagreed": 0, "unchecked": 0}
        for env_plan, cells in build:
            held = {c.cell_id: c for c in cells if c.cell_id in self.writer.held}
            if not held:
                continue
            env = env_plan.env
            self.writer.progress.describe(f"{env.name}: latency")
            # The environment's latency workers share the models a runtime compiled: the
            # confirming workers load what the first one compiled (``Job.compiled_cache``).
            cache = self.ctx.job.spool / f".compiled-{env.name}"
            first = dataclasses.replace(self.ctx, job=self.ctx.job.replace(compiled_cache=str(cache)))

            def again(ids: list[str], protocol: LatencyProtocol) -> dict[str, Record]:
                self.writer.progress.describe(f"{env.name}: latency check")
                ctx = dataclasses.replace(first, job=first.job.replace(latency=protocol, bundles=False, floor=False))
                return self._time(env_plan, [held[i] for i in ids], ctx)[0]

            try:
                timings, restarts = self._time(env_plan, list(held.values()), first)
                for key, n in confirm(timings, self.job.latency, again).items():
                    checks[key] += n
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            for rec in timings.values():
                self.writer.timing(rec)
            with self.ctx.meta_lock:
                if env.name in self.meta.environments:
                    self.meta.environments[env.name]["latency_worker_restarts"] = restarts
        self.meta.extra["latency_checks"] = checks

    def _time(self, env_plan: EnvPlan, cells: list[Cell], ctx: RunContext) -> tuple[dict[str, Record], int]:
        """One latency worker over ``cells``: their timing records by cell id, and its restarts."""
        out: dict[str, Record] = {}
        work = EnvWork(env_plan)
        self.latency_works.append(work)
        sup = WorkerSupervisor(ctx, env_plan, lambda rec: out.__setitem__(rec.cell_id, rec),
                               on_event=self._on_event, work=work, phase=PHASE_LATENCY)
        try:
            restarts = sup.run(cells)
        except EnvironmentBuildError as exc:
            restarts = 1
            for cell in cells:
                out[cell.cell_id] = planned_record(self.meta.run_id, cell, env_plan.env.name, Status.CRASH,
                                                   error=f"{type(exc).__name__}: {exc}"[:500])
        return out, restarts
