"""The supervisor against workers that break the protocol, played by a small stdlib script (no
torch): each planned cell still gets exactly one record and the supervisor never loops."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from harness.core.job import Job
from harness.envs.provider import EnvironmentBuildError
from harness.matrix.config import Matrix
from harness.matrix.plan import build_plan
from harness.run.context import Limits, RunContext
from harness.run.supervisor import MAX_DEATHS_PER_CELL, WorkerSupervisor

FAKE_WORKER = '''
import json, os, sys, time
from harness.core.job import Job
from harness.envs.provider import EnvironmentBuildError
from harness.core.record import Record
from harness.core.status import Status

args = sys.argv[1:]
job = Job.read(args[args.index("--job") + 1])
out = os.fdopen(int(args[args.index("--events-fd") + 1]), "w", buffering=1)
mode = os.environ["FAKE_MODE"]

def emit(**event):
    out.write(json.dumps({**event, "pid": os.getpid()}) + "\\n")
    out.flush()

emit(event="hello")
if mode == "bye-at-once":
    emit(event="bye")
    sys.exit(0)
for group in job.groups:
    emit(event="group_start", gid=group.gid)
    for cell in group.cells:
        emit(event="cell_start", cell_id=cell.cell_id)
        if mode == "garbage":
            out.write("this is not an event\\n")
            out.flush()
            time.sleep(60)
        if mode == "exit0":
            os._exit(0)
        rec = Record.for_cell(job.run_id, group.key(cell), "2.13.0", job.env, Status.PASS,
                              cell_id=cell.cell_id)
        emit(event="record", record=rec.to_dict())
        if mode == "twice":
            emit(event="record", record=rec.to_dict())
        if mode == "flood":
            print("x" * 100000, flush=True)
    if mode == "bye-early":
        break
emit(event="bye")
'''


class FakeProvider:
    name = "venv"

    def __init__(self, script: Path, mode: str) -> None:
        self.script, self.mode = script, mode

    def worker_command(self, spec):
        return [sys.executable, str(self.script)]

    def worker_env(self, spec, threads):
        return {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_MODE": self.mode}


def supervisor(tmp_path, mode, records):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    matrix = Matrix.model_validate({"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [17],
                                    "cases": ["conv_bn", "mha", "lstm"], "cell_timeout_s": 30})
    env_plan = build_plan(matrix).environments[0]
    run_dir = tmp_path / "run"
    ctx = RunContext(job=Job(run_id="r", run_dir=str(run_dir), env="", groups=()),
                     provider=FakeProvider(script, mode), limits=Limits(30, log_max_mb=0.01))
    sup = WorkerSupervisor(ctx, env_plan, records.append)
    return sup, env_plan, run_dir


@pytest.mark.parametrize("mode, status, restarts", [
    ("normal", "pass", 0),
    ("twice", "pass", 0),                                  # a second record of a cell is dropped
    ("flood", "pass", 0),
    ("exit0", "crash", 3 * MAX_DEATHS_PER_CELL - 1),       # every cell kills 2 workers
    ("garbage", "crash", 3 * MAX_DEATHS_PER_CELL - 1),
    ("bye-early", "pass", 2),            # bye after one group: the next group is charged, re-run
])
def test_each_cell_gets_one_record_whatever_the_worker_does(tmp_path, mode, status, restarts):
    records = []
    sup, env_plan, run_dir = supervisor(tmp_path, mode, records)
    assert sup.run(env_plan.cells) == restarts
    assert sorted(r.cell_id for r in records) == sorted(c.cell_id for c in env_plan.cells)
    assert {r.status for r in records} == {status}
    for log in (run_dir / "logs").iterdir():
        assert log.stat().st_size <= 0.01 * 2**20 + 256


def test_a_worker_that_never_starts_a_group_is_an_environment_failure(tmp_path):
    """Not an endless restart: the runner records the environment's cells as crashed."""
    sup, env_plan, _ = supervisor(tmp_path, "bye-at-once", [])
    with pytest.raises(EnvironmentBuildError, match="ended before running a cell"):
        sup.run(env_plan.cells)
