"""Interleaved A/B timing, runner side: two exported files (or more) timed in alternation, in many
short rounds, in several fresh processes (``harness.worker.runtime_only.ab_timer`` is the process).

A *file* is a spool folder (an exported file and its feeds) with how its cell runs it (precision,
runtime options); a *stack* is an interpreter with one runtime release (a runtime-only
environment, or a cell's own). Every process loads every file, so files are compared within a
process, round by round (per-process modes move both alike). Where two stacks are compared, a
process of each is started and their rounds alternate (which one goes first drawn per round), so
both stacks are timed in the same moments; enough fresh processes average the per-process modes
out rather than letting one decide. ``decided(run)`` (the caller's statistics) ends the timing
once ``min_processes`` sets are in, else it goes on to ``max_processes``.

Each round records the share of it the timing process ran on a CPU; a round below
``harness.core.timing.CONTENDED`` was competing for its core (with other processes, or with the
hypervisor: stolen time is not the process's) and is no evidence; a GPU runtime's process, whose
share says nothing, is lost as a whole where its window had steal (``ProcessTiming.clean``).
"""
from __future__ import annotations

import contextlib
import json
import queue
import random
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.core.job import LatencyProtocol
from harness.core.timing import CONTENDED, STEAL_LOADED
from harness.core.wire import AB_PREFIX, AB_TIMER_MODULE

# Warm-up of each file in each process: short (the first round is dropped too, and a round's two
# files are compared with each other), windows agreeing within 5 %, at most 0.15 s.
WARMUP = LatencyProtocol(warmup_runs=10, warmup_s=0.03, warmup_max_s=0.15, warmup_windows=3, warmup_tolerance=0.05)
# Two stacks are compared across processes, where per-process modes do not cancel: at least this
# many process sets, so that one unlucky draw of modes cannot make a narrow interval.
MIN_SETS_TWO_STACKS = 6


@dataclass(frozen=True)
class TimedFile:
    spool: Path
    precision: str = "fp32"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Stack:
    label: str                          # "onnxruntime 1.32.0"
    python: str                         # the interpreter
    runtime: str                        # the runtime's registry name ("ort-cpu")
    env: dict[str, str] | None = None   # the process environment (the harness on PYTHONPATH)


@dataclass(frozen=True)
class ABSettings:
    min_processes: int = 4        # process sets (one process per stack) before ``decided`` is asked
    max_processes: int = 12
    rounds: int = 20              # most rounds per process ...
    min_rounds: int = 6           # ... and fewest, as fit ``process_s`` of timing per process
    process_s: float = 1.5
    discard_rounds: int = 1       # the first round of each process is not kept
    block_s: float = 0.002
    block_calls: int = 3
    threads: int = 1
    load_timeout_s: float = 600.0
    seed: int | None = None


@dataclass
class ProcessTiming:
    """One fresh process of one stack: per kept round, the ms of each file and the CPU share."""

    stack: int
    t: list[list[float]] = field(default_factory=list)
    cpu: list[float | None] = field(default_factory=list)    # None: a GPU runtime (not told)
    load: dict[str, Any] = field(default_factory=dict)
    version: str | None = None

    @property
    def stolen(self) -> bool:
        return (self.load.get("steal") or 0.0) > STEAL_LOADED

    def clean(self, r: int) -> bool:
        """Round ``r`` is evidence: the process had its core for most of it. Steal from its own
        CPU shows in the round's share (a guest's kernel does not count stolen time as the
        process's: on a 2-CPU KVM guest, 5 ms rounds below half their time went from 2 % to 9 %
        of them as the machine's steal went from 3 % to 11 %), and steal from the other CPUs
        touches both files of a round alike. A GPU runtime's process tells no share: a window
        with steal is lost as a whole."""
        share = self.cpu[r]
        return not self.stolen if share is None else share >= CONTENDED

    def clean_rounds(self) -> list[int]:
        return [r for r in range(len(self.t)) if self.clean(r)]

    def medians(self) -> list[float] | None:
        """Per file, the median of its clean rounds (None: no clean round)."""
        kept = self.clean_rounds()
        if not kept:
            return None
        return [statistics.median(self.t[r][f] for r in kept) for f in range(len(self.t[0]))]


@dataclass
class ABRun:
    """What the timing gave: processes in start order (with two stacks, a set is one of each)."""

    stacks: list[str]
    processes: list[ProcessTiming] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None        # why it stopped before a single set was in

    def sets(self) -> list[list[ProcessTiming]]:
        n = len(self.stacks)
        return [self.processes[i:i + n] for i in range(0, len(self.processes) - n + 1, n)]

    @property
    def rounds(self) -> int:
        return sum(len(p.t) for p in self.processes)

    @property
    def clean(self) -> int:
        return sum(len(p.clean_rounds()) for p in self.processes)


class TimerError(RuntimeError):
    """A timing process that could not load, answered nothing in time, or ended."""


class TimerProcess:
    """One ``ab_timer`` process and its answers (a thread reads them off stdout)."""

    def __init__(self, stack: Stack, spec: Path, log: Path) -> None:
        self.log = log
        with log.open("w") as stderr:   # the child keeps its own descriptor
            self.proc = subprocess.Popen([stack.python, "-m", AB_TIMER_MODULE, str(spec)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                         text=True, env=stack.env, start_new_session=True)
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:   # type: ignore[union-attr]
            if line.startswith(AB_PREFIX):
                with contextlib.suppress(ValueError):
                    self.answers.put(json.loads(line[len(AB_PREFIX):]))
        self.answers.put(None)

    def ask(self, command: str | None, timeout: float) -> dict[str, Any]:
        if command is not None:
            try:
                self.proc.stdin.write(command + "\n")   # type: ignore[union-attr]
                self.proc.stdin.flush()                 # type: ignore[union-attr]
            except OSError:
                pass                                    # it ended: the answer says so
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise TimerError(f"no answer within {timeout:.0f} s") from None
        if answer is None:
            self.proc.wait(timeout=10)
            tail = " ".join(self.log.read_text(errors="replace").split()[-40:])[-400:]
            raise TimerError(f"the timing process ended ({self.proc.returncode}): {tail}")
        return answer

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _spec(files: list[TimedFile], stack: Stack, settings: ABSettings, seed: int) -> dict[str, Any]:
    return {"runtime": stack.runtime, "threads": settings.threads, "seed": seed, "block_s": settings.block_s,
            "block_calls": settings.block_calls, "warmup": WARMUP.to_dict(),
            "files": [{"spool": str(f.spool), "precision": f.precision, "options": f.options} for f in files]}


def _rounds(call_ms: list[list[float]], settings: ABSettings) -> tuple[int, float]:
    """Rounds per process that fit ``process_s``, and a generous timeout for one round."""
    round_s = sum(max(c / 1e3 * settings.block_calls, settings.block_s) for ms in call_ms for c in ms)
    n = int(settings.process_s / max(round_s, 1e-9))
    return max(settings.min_rounds, min(settings.rounds, n)), 60.0 + 20 * round_s


def one_set(files: list[TimedFile], stacks: list[Stack], settings: ABSettings, rng: random.Random,
            work: Path) -> list[ProcessTiming]:
    """A fresh process per stack, each loading every file; their rounds alternate."""
    procs: list[TimerProcess] = []
    try:
        ready = []
        for s, stack in enumerate(stacks):     # one loads while the other waits: no overlap
            spec = work / f"spec-{s}.json"
            spec.write_text(json.dumps(_spec(files, stack, settings, rng.randrange(2 ** 31))))
            procs.append(TimerProcess(stack, spec, work / f"timer-{s}.log"))
            answer = procs[-1].ask(None, settings.load_timeout_s)
            if not answer.get("ready"):
                raise TimerError(f"{stack.label}: {answer.get('error')}")
            ready.append(answer)
        rounds, timeout = _rounds([a["call_ms"] for a in ready], settings)
        out = [ProcessTiming(s, version=a.get("version")) for s, a in enumerate(ready)]
        for r in range(settings.discard_rounds + rounds):
            for s in rng.sample(range(len(procs)), len(procs)):
                answer = procs[s].ask("round", timeout)
                if r >= settings.discard_rounds:
                    out[s].t.append(answer["t"])
                    out[s].cpu.append(answer["cpu"])
        for s, proc in enumerate(procs):
            out[s].load = proc.ask("end", 60).get("load") or {}
            proc.proc.wait(timeout=30)
        return out
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                proc.kill()


def time_interleaved(files: list[TimedFile], stacks: list[Stack], settings: ABSettings = ABSettings(),
                     decided: Callable[[ABRun], bool] | None = None) -> ABRun:
    """Sets of fresh processes until ``decided`` (after ``min_processes``) or ``max_processes``."""
    rng = random.Random(settings.seed)
    run = ABRun([s.label for s in stacks])
    least = settings.min_processes if len(stacks) < 2 else max(settings.min_processes, MIN_SETS_TWO_STACKS)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="harness-ab-") as tmp:
        for n in range(1, settings.max_processes + 1):
            try:
                run.processes += one_set(files, stacks, settings, rng, Path(tmp))
            except TimerError as exc:
                run.error = str(exc)
                break
            if n >= least and decided is not None and decided(run):
                break
    run.seconds = round(time.perf_counter() - t0, 2)
    return run


# -- per-process figures ------------------------------------------------------------------------
# Process medians that split at a gap of at least this ratio, with at least two processes on each
# side and each side tighter than the gap, are two modes ("bimodal"), reported with both.
BIMODAL_GAP = 1.15


@dataclass(frozen=True)
class Modes:
    low: float          # median of the processes of the lower mode (ms)
    high: float
    n_low: int
    n_high: int

    def text(self) -> str:
        return f"{self.low:.3g} ms ({self.n_low} processes) / {self.high:.3g} ms ({self.n_high})"

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "n_low": self.n_low, "n_high": self.n_high}


def modes(values: list[float], gap: float = BIMODAL_GAP) -> Modes | None:
    """Two modes among per-process medians, or None (one mode, or too few processes to tell)."""
    v = sorted(x for x in values if x > 0)
    if len(v) < 4:
        return None
    k = max(range(1, len(v) - 2), key=lambda i: v[i + 1] / v[i])   # the widest gap, 2+ each side
    low, high, ratio = v[:k + 1], v[k + 1:], v[k + 1] / v[k]
    if ratio < gap or low[-1] / low[0] >= ratio or high[-1] / high[0] >= ratio:
        return None
    return Modes(statistics.median(low), statistics.median(high), len(low), len(high))
