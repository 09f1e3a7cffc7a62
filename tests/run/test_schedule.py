"""The scheduler: verdicts in parallel, latency alone after them. Workers are played by a small
stdlib script (no torch) that stamps when it runs what, so the tests assert orderings (no
timing taken while a verdict runs), never durations."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

from harness.core.env import EnvMarker
from harness.core.record import read_records
from harness.core.status import Status
from harness.matrix.config import Matrix
from harness.matrix.plan import build_plan
from harness.run.context import RunRequest
from harness.run.execute import execute
from harness.store.runs import read_run_meta

FAKE_WORKER = '''
import json, os, sys, time
from harness.core.job import Job, ExportGroup
from harness.core.record import Record
from harness.core.status import Status

args = sys.argv[1:]
job = Job.read(args[args.index("--job") + 1])
out = os.fdopen(int(args[args.index("--events-fd") + 1]), "w", buffering=1)
feed = os.fdopen(int(args[args.index("--groups-fd") + 1])) if "--groups-fd" in args else None
stamps = os.environ["FAKE_STAMPS"]
dies_in = os.environ.get("FAKE_DIES_IN", "")          # phase:case whose cells kill the worker
phase = "latency" if job.phase == "latency" else "verdict"

def emit(**event):
    out.write(json.dumps({**event, "pid": os.getpid()}) + "\\n")
    out.flush()

def stamp(cell, start):
    line = json.dumps({"phase": phase, "cell": cell, "start": start, "end": time.monotonic(),
                       "pid": os.getpid(), "env": job.env, "cache": job.compiled_cache}) + "\\n"
    fd = os.open(stamps, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())
    os.close(fd)

def groups():
    yield from job.groups
    while feed is not None:
        emit(event="want")
        data = json.loads(feed.readline() or "null")
        if data is None:
            return
        for one in data if isinstance(data, list) else [data]:   # a family: its groups in order
            yield ExportGroup.from_dict(one)

if os.environ.get("FAKE_KILLED_AT_START"):     # the first N workers: SIGKILL while importing
    count = os.environ["FAKE_STAMPS"] + ".starts"
    fd = os.open(count, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"x")
    os.close(fd)
    if os.path.getsize(count) <= int(os.environ["FAKE_KILLED_AT_START"]):
        os.kill(os.getpid(), 9)
emit(event="hello")
if job.compiled_cache:                          # what a runtime's model cache would leave
    os.makedirs(job.compiled_cache, exist_ok=True)
    open(os.path.join(job.compiled_cache, f"{os.getpid()}.blob"), "w").close()
if os.environ.get("FAKE_DIES_AT_START"):
    os._exit(3)
for group in groups():
    emit(event="group_start", gid=group.gid)
    for cell in group.cells:
        emit(event="cell_start", cell_id=cell.cell_id)
        start = time.monotonic()
        if dies_in == f"{phase}:{group.case}":
            os._exit(0)
        time.sleep(float(os.environ.get("FAKE_CELL_S", "0.05")))
        rec = Record.for_cell(job.run_id, group.key(cell), "2.13.0", job.env, Status.PASS,
                              cell_id=cell.cell_id, duration_s={phase: 0.05})
        if phase == "verdict":
            rec.parity.max_abs = 0.0
        else:
            rec.latency_ms.median = rec.latency_ms.min = 1.0
            rec.latency_ms.iterations = 200
        stamp(cell.cell_id, start)
        emit(event="record", record=rec.to_dict())
emit(event="bye")
'''


class FakeProvider:
    name = "venv"

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self.script, self.env = script, env

    def skip_reason(self, spec):
        return None

    def ensure(self, spec):
        return EnvMarker.for_spec(spec, installed=[f"torch=={spec.torch}", "onnx==1.0"], reused=True)

    def worker_command(self, spec):
        return [sys.executable, str(self.script)]

    def worker_env(self, spec, threads):
        return {**os.environ, "PYTHONPATH": str(ROOT), **self.env}


class SlowSecondProvider(FakeProvider):
    """The second environment takes a moment to prepare (an installed one is checked in seconds)."""

    def ensure(self, spec):
        if spec.torch == "2.13.0":
            time.sleep(1.5)
        return super().ensure(spec)


def run(tmp_path, torch=("2.13.0",), jobs=2, provider_cls=FakeProvider, **env):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    stamps = tmp_path / "stamps.jsonl"
    matrix = Matrix.model_validate({"torch": list(torch), "exporters": ["torchscript", "dynamo"],
                                    "opsets": [17], "runtimes": ["ort-cpu", "openvino"],
                                    "cases": ["conv_bn", "mha", "lstm"], "cell_timeout_s": 30})
    plan = build_plan(matrix)
    provider = provider_cls(script, {"FAKE_STAMPS": str(stamps), **env})
    run_dir = execute(RunRequest(matrix, tmp_path / "m.yaml", plan, tmp_path / "reports", tmp_path / "run",
                                 provider, jobs=jobs))
    intervals = [json.loads(line) for line in stamps.read_text().splitlines()] if stamps.exists() else []
    return plan, run_dir, read_records(run_dir / "results.jsonl"), intervals


def test_no_timing_overlaps_a_verdict_and_timings_run_one_at_a_time(tmp_path):
    plan, run_dir, records, intervals = run(tmp_path, torch=("2.6.0", "2.13.0"))
    verdicts = [i for i in intervals if i["phase"] == "verdict"]
    timings = sorted((i for i in intervals if i["phase"] == "latency"), key=lambda i: i["start"])
    # Each cell is timed twice: by the latency worker and by the worker that confirms its figure.
    assert len(verdicts) == len(plan.cells) == 24 and len(timings) == 2 * len(plan.cells)
    # Every timing starts after every verdict ended, and no two timings overlap.
    assert min(t["start"] for t in timings) >= max(v["end"] for v in verdicts)
    assert all(a["end"] <= b["start"] for a, b in zip(timings, timings[1:]))
    # Each passing verdict got its timing joined; the file is in plan order.
    assert [r.cell_id for r in records] == [c.cell_id for c in plan.cells]
    assert all(r.status is Status.PASS and r.latency_ms.median == 1.0 and r.parity.max_abs == 0.0
               for r in records)
    assert all(set(r.duration_s) == {"verdict", "latency"} for r in records)
    meta = read_run_meta(run_dir)
    assert meta.finished and meta.extra["schedule"]["jobs"] == 2


def test_an_environments_latency_workers_share_one_compiled_model_cache_removed_after_it(tmp_path):
    """The first latency worker and the confirming ones of an environment are given one folder for
    the models a runtime compiled (OpenVINO's cache), each environment its own, inside the run's
    spool; nothing of it is left once the environment's timings are done. Verdict workers get none."""
    _, run_dir, _, intervals = run(tmp_path, torch=("2.6.0", "2.13.0"))
    caches: dict[str, set] = {}
    for i in intervals:
        if i["phase"] == "latency":
            caches.setdefault(i["env"], set()).add(i["cache"])
        else:
            assert i["cache"] is None
    assert len(caches) == 2 and all(len(c) == 1 for c in caches.values()), caches
    folders = [Path(next(iter(c))) for c in caches.values()]
    assert folders[0] != folders[1] and all(f.parent == run_dir / "spool" for f in folders)
    assert len({i["pid"] for i in intervals if i["phase"] == "latency"}) == 4   # first and confirming, per env
    assert not any(f.exists() for f in folders)


def test_two_workers_share_one_environment(tmp_path):
    """One environment, two slots: both take its groups (the queue is pulled one group at a
    time), each cell once."""
    plan, _, records, intervals = run(tmp_path, FAKE_CELL_S="0.2")
    pids = {i["pid"] for i in intervals if i["phase"] == "verdict"}
    assert len(pids) == 2
    assert sorted(r.cell_id for r in records) == sorted(c.cell_id for c in plan.cells)


def test_a_free_slot_waits_for_an_environment_being_prepared_before_doubling_up(tmp_path):
    """Two slots, the second environment ready 1.5 s after the first: the second slot starts its
    first worker on it rather than a second worker of the first (which would import torch again);
    once nothing more is coming, a free slot joins the environment with the most left."""
    plan, _, records, intervals = run(tmp_path, torch=("2.6.0", "2.13.0"), provider_cls=SlowSecondProvider,
                                      FAKE_CELL_S="0.3")
    verdicts = sorted((i for i in intervals if i["phase"] == "verdict"), key=lambda i: i["start"])
    first_env: dict[int, str] = {}
    for i in verdicts:
        first_env.setdefault(i["pid"], i["env"])
    starts = list(first_env.values())
    assert starts[:2] == [e.env.name for e in plan.environments], starts
    assert sorted(r.cell_id for r in records) == sorted(c.cell_id for c in plan.cells)


def test_a_cell_that_kills_verdict_workers_is_a_crash_and_the_rest_runs(tmp_path):
    plan, run_dir, records, _ = run(tmp_path, FAKE_DIES_IN="verdict:mha")
    by_case: dict[str, set] = {}
    for r in records:
        by_case.setdefault(r.case, set()).add(r.status)
    assert by_case == {"conv_bn": {Status.PASS}, "mha": {Status.CRASH}, "lstm": {Status.PASS}}
    assert all("2 workers died" in r.notes[0] for r in records if r.case == "mha")
    assert all(r.cache_key is None for r in records if r.case == "mha")     # never reused
    meta = read_run_meta(run_dir)
    # 4 mha cells, each killing 2 workers (the retry may land in either slot).
    assert list(meta.environments.values())[0]["worker_restarts"] == 8


def test_a_death_in_the_latency_phase_keeps_the_verdict_and_fails_at_latency(tmp_path):
    _, _, records, _ = run(tmp_path, FAKE_DIES_IN="latency:lstm")
    lstm = [r for r in records if r.case == "lstm"]
    assert lstm and all((r.status, r.stage) == (Status.CRASH, "latency") for r in lstm)
    assert all(r.parity.max_abs == 0.0 and not r.latency_ms for r in lstm)    # the verdict's parts
    assert all(r.status is Status.PASS for r in records if r.case != "lstm")


def test_workers_that_die_before_any_cell_fail_the_environment_once(tmp_path):
    plan, _, records, _ = run(tmp_path, FAKE_DIES_AT_START="1")
    assert sorted(r.cell_id for r in records) == sorted(c.cell_id for c in plan.cells)   # none twice
    assert all(r.status is Status.CRASH and r.error.startswith("EnvironmentBuildError") for r in records)


def test_a_worker_killed_while_starting_is_retried_and_its_cells_run(tmp_path):
    """An OOM kill during `import torch` is not a broken environment: two workers killed before
    their first group, then every cell runs in the next ones, nothing charged to any cell."""
    plan, run_dir, records, _ = run(tmp_path, jobs=1, FAKE_KILLED_AT_START="2")
    assert [r.cell_id for r in records] == [c.cell_id for c in plan.cells]
    assert all(r.status is Status.PASS and not r.notes for r in records), [(r.status, r.error) for r in records]
    assert list(read_run_meta(run_dir).environments.values())[0]["worker_restarts"] == 2


def test_workers_killed_while_starting_again_and_again_fail_the_environment(tmp_path):
    plan, _, records, _ = run(tmp_path, jobs=1, FAKE_KILLED_AT_START="99")
    assert sorted(r.cell_id for r in records) == sorted(c.cell_id for c in plan.cells)
    assert all(r.status is Status.CRASH and r.error.startswith("EnvironmentBuildError") for r in records)
    assert "worker killed by signal SIGKILL; 3 workers in a row were killed while starting" in records[0].error


@pytest.mark.parametrize("jobs", [1, 3])
def test_any_number_of_slots_gives_every_cell_one_record(tmp_path, jobs):
    plan, _, records, intervals = run(tmp_path, torch=("2.6.0", "2.13.0"), jobs=jobs)
    assert [r.cell_id for r in records] == [c.cell_id for c in plan.cells]
    verdicts = [i for i in intervals if i["phase"] == "verdict"]
    assert min(i["start"] for i in intervals if i["phase"] == "latency") >= max(v["end"] for v in verdicts)
