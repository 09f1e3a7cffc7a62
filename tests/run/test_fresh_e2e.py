"""A verdict does not depend on the schedule: every export group runs in a fresh process forked
from the environment's warm worker. On torch 2.13.0 the dynamo export of the LSTM-with-state
models depends on what the same process exported before; the matrix (tests/matrices/schedule.yaml)
runs with one and two workers, groups in plan, reversed and shuffled order, and every cell's
(status, stage) is the same, and the same as a plain export in a new interpreter."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import TESTS, env_python, run_harness

from harness.core.record import read_records
from harness.core.wire import WORKER_MODULE
from harness.store.runs import read_run_meta

pytestmark = pytest.mark.e2e
CONFIG = TESTS / "matrices" / "schedule.yaml"
CASES = TESTS / "cases" / "structured.py"
SCHEDULES = {"plan-1": ("1", ""), "reverse-2": ("2", "reverse"), "shuffle-1": ("1", "shuffle:7")}


def run(reports: Path, jobs: str, order: str) -> Path:
    proc = run_harness("--reports", str(reports), "matrix", "--config", str(CONFIG), "--fresh", "--jobs", jobs,
                       check=False, env={"HARNESS_GROUP_ORDER": order})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("run directory")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    reports = tmp_path_factory.mktemp("schedule") / "reports"
    return {name: run(reports, jobs, order) for name, (jobs, order) in SCHEDULES.items()}


def verdicts(run_dir: Path) -> dict[str, tuple]:
    return {r.cell_id: (r.status.value, r.stage) for r in read_records(run_dir / "results.jsonl")}


def test_every_schedule_gives_the_same_verdicts(runs):
    maps = {name: verdicts(d) for name, d in runs.items()}
    assert all(len(m) == 10 for m in maps.values())
    first = maps["plan-1"]
    assert {name: {c: v for c, v in m.items() if first[c] != v} for name, m in maps.items()} == \
        {name: {} for name in maps}


def test_the_lstm_state_cells_match_an_export_in_a_new_interpreter_under_every_schedule(runs, tmp_path):
    # lstm_state and lstm_state_seq: the models whose export on torch 2.13.0 depends on the
    # exports before it in the process. The plain script exports each in a process of its own and
    # hands dynamo the dims as torch.onnx.export's documentation asks (dynamic_shapes).
    first = runs["plan-1"]
    meta = read_run_meta(first)
    recs = [r for r in read_records(first / "results.jsonl") if r.case.startswith("lstm_state") and r.exporter == "dynamo"]
    assert sorted(r.case for r in recs) == ["lstm_state", "lstm_state_seq"]
    job, out = tmp_path / "lstm.json", tmp_path / "lstm.jsonl"
    job.write_text(json.dumps([{"case_file": str(CASES), "case_fn": r.case, "exporter": "dynamo",
                                "opset": r.opset, "cell_id": r.cell_id} for r in recs]))
    proc = subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "direct_verdict.py"), str(job), str(out)],
                          capture_output=True, text=True, cwd=TESTS, timeout=900,
                          env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert out.exists(), proc.stderr[-3000:]
    direct = {d["cell_id"]: d for d in map(json.loads, out.read_text().splitlines())}
    assert set(direct) == {r.cell_id for r in recs}
    for name, run_dir in runs.items():
        for rec in read_records(run_dir / "results.jsonl"):
            if rec.cell_id in direct:
                d = direct[rec.cell_id]
                assert (rec.status.value, rec.stage) == (d["status"], d["stage"]), (name, rec.error, d["error"])
    # the strategy torch captured the graph with, read by the plain script from torch's ONNXProgram
    names = {"TorchExportNonStrictStrategy": "torch.export(strict=False)",
             "TorchExportStrictStrategy": "torch.export(strict=True)"}
    for rec in recs:
        if direct[rec.cell_id].get("capture"):
            assert rec.graph["capture_strategy"] == names[direct[rec.cell_id]["capture"]]


def test_a_dynamo_record_names_the_capture_strategy(runs):
    recs = [r for r in read_records(runs["plan-1"] / "results.jsonl") if r.exporter == "dynamo"]
    exported = [r for r in recs if r.stage not in ("reference", "export")]
    assert exported and all(r.graph["capture_strategy"] in ("torch.export(strict=False)", "torch.export(strict=True)")
                            for r in exported)
    assert all("capture_strategy" not in r.graph for r in recs if r.stage == "export")


WORKER_CASES = '''
import os, torch
def lin():
    return torch.nn.Linear(4, 3), (torch.randn(2, 4),), {0: {0: "batch"}}
def lin2():
    return torch.nn.Linear(4, 2), (torch.randn(2, 4),), {0: {0: "batch"}}
def segfaults():
    os.kill(os.getpid(), 11)
'''


def test_the_warm_worker_forks_each_group_and_dies_as_its_group_did(runs, tmp_path):
    from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
    from harness.envs.provider import harness_process_env

    python = env_python(read_run_meta(runs["plan-1"]), "2.13.0")
    (tmp_path / "cases.py").write_text(WORKER_CASES)
    groups = tuple(ExportGroup(f"g{i}", fn, f"{tmp_path / 'cases.py'}:{fn}", "torchscript", 17,
                               cells=(CellJob(f"c{i}", "ort-cpu", "ort-cpu"),))
                   for i, fn in enumerate(("lin", "lin", "segfaults", "lin2")))
    # The worker runs family by family (one case, release and options; harness.core.job.families):
    # g0 and g1 are one family, g2 and g3 each their own, in the job's order.
    job = Job(run_id="r", run_dir=str(tmp_path / "run"), env="e", groups=groups, base_dir=str(tmp_path),
              latency=LatencyProtocol(enabled=False), bundles=False).write(tmp_path / "job.json")
    events_r, events_w = os.pipe()
    proc = subprocess.Popen([str(python), "-m", WORKER_MODULE, "--job", str(job), "--events-fd", str(events_w)],
                            pass_fds=(events_w,), env=harness_process_env(1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(events_w)
    with os.fdopen(events_r) as stream:
        events = [json.loads(line) for line in stream]
    assert proc.wait(timeout=600) == -11          # the group's SIGSEGV ends the worker the same way
    hello = events[0]
    assert hello["event"] == "hello" and hello["fresh"] and "torch" in hello["preloaded"]
    # the warm parent: its main thread and ONNX Runtime's idle one, no pool of torch's
    assert hello["threads"] <= 2
    starts = [e for e in events if e["event"] == "group_start"]
    assert [e["gid"] for e in starts] == ["g0", "g1", "g2"]      # g3 never ran: the worker died
    assert {e["parent"] for e in starts} == {hello["pid"]}
    assert len({e["pid"] for e in starts} | {hello["pid"]}) == 4    # a process per group
    stages = [e["stage"] for e in events if e["event"] == "stage" and e["pid"] == starts[2]["pid"]]
    assert stages == ["reference"]                                  # where g2 died
    assert [e["event"] for e in events].count("record") == 2 and events[-1]["event"] != "bye"
