"""Containment: a case that raises, aborts, hangs, exits, forks, floods or hogs memory is one bad
cell, never a dead, endless or doubled run; a runner is alone on its run directory and a signal
ends its workers and leaves the run resumable."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from helpers import ROOT, TESTS, harness_command, product_env, run_harness, run_matrix

from harness.core.record import read_records
from harness.core.wire import SCRATCH_PREFIX
from harness.store.runs import read_run_meta

pytestmark = pytest.mark.e2e
HOSTILE = TESTS / "matrices" / "hostile.yaml"
SIGNALS = TESTS / "matrices" / "signals.yaml"


def harness(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(harness_command(*args), cwd=ROOT, capture_output=True, text=True,
                          env=product_env(**(env or {})))
    if check and proc.returncode != 0:
        raise AssertionError(f"harness {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
    return proc


def start_runner(*args: str, slow_s: float = 600) -> subprocess.Popen:
    return subprocess.Popen(harness_command("matrix", "--config", str(SIGNALS), *args),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=product_env(HOSTILE_SLOW_S=str(slow_s)))


def wait_for(condition, what: str, limit_s: float = 300) -> None:
    """Wait until the runner has reached a state (not a timing assertion: the limit only keeps
    a broken runner from hanging the suite)."""
    end = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"never reached: {what}")
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory):
    """The temporary directory the misbehaving run's workers make their scratch folders in."""
    return tmp_path_factory.mktemp("worker-tmp")


@pytest.fixture(scope="module")
def misbehaving_run(tmp_path_factory, scratch_root):
    return run_matrix(tmp_path_factory, "bad", "misbehaving.yaml", env={"TMPDIR": str(scratch_root)})


def test_a_killed_workers_scratch_folder_is_removed(misbehaving_run, scratch_root):
    # Workers were killed (the hang's timeout, the aborts): none left its exports behind.
    assert list(read_run_meta(misbehaving_run).environments.values())[0]["worker_restarts"] == 3
    assert list(scratch_root.glob(f"{SCRATCH_PREFIX}*")) == []


def test_raise_abort_hang_are_contained(misbehaving_run):
    recs = {r.case: r for r in read_records(misbehaving_run / "results.jsonl")}
    assert (recs["raises"].status, recs["raises"].stage) == ("fail", "reference")
    assert "broken on purpose" in recs["raises"].error
    assert "Traceback" in open(recs["raises"].log).read()
    assert recs["aborts"].status == "crash" and "SIGABRT" in recs["aborts"].error
    # The case aborts while it is being built: charged to that stage, not to the export.
    assert recs["aborts"].stage == "reference"
    assert (recs["hangs"].stage, recs["conv_bn"].stage) == ("reference", None)
    assert recs["hangs"].status == "timeout"
    assert recs["conv_bn"].status == "pass"  # the run went on after all three
    meta = json.loads((misbehaving_run / "run.json").read_text())
    assert meta["finished"]
    # The abort is retried once in a fresh worker (2 deaths), the hang is not: 3 restarts.
    assert list(meta["environments"].values())[0]["worker_restarts"] == 3
    assert "2 workers died" in recs["aborts"].notes[0]


def test_interrupted_run_resumes_without_redoing_cells(misbehaving_run, tmp_path):
    # Simulate an interruption: copy the run, drop the last record and the finished flag.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(misbehaving_run, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if '"case": "conv_bn"' not in ln]
    # ... and the first bytes of its record, as a kill inside write() leaves them.
    torn = next(ln for ln in lines if '"case": "conv_bn"' in ln)[:40]
    (run / "results.jsonl").write_text("\n".join(kept) + "\n" + torn)
    meta = json.loads((run / "run.json").read_text())
    meta["finished"] = False
    (run / "run.json").write_text(json.dumps(meta))
    proc = run_harness("matrix", "--config", str(TESTS / "matrices" / "misbehaving.yaml"), "--output",
                       str(run), "--only", "case=conv_bn|raises")
    assert f"cut a torn last line at byte {len(chr(10).join(kept)) + 1}" in proc.stderr
    # Every line is a whole record (the strict reader raises on anything else), none twice.
    recs = read_records(run / "results.jsonl")
    assert len((run / "results.jsonl").read_text().splitlines()) == len(recs) == 4
    assert [r.case for r in recs].count("conv_bn") == 1
    assert [r.case for r in recs].count("raises") == 1
    assert recs[-1].case == "conv_bn" and recs[-1].status == "pass"


def test_finished_run_is_immutable(misbehaving_run):
    proc = run_harness("matrix", "--config", str(TESTS / "matrices" / "misbehaving.yaml"),
                       "--output", str(misbehaving_run), check=False)
    assert proc.returncode == 2 and "immutable" in proc.stderr


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    pids = tmp_path_factory.mktemp("pids")
    out = tmp_path_factory.mktemp("hostile") / "run"
    harness("matrix", "--config", str(HOSTILE), "--output", str(out), env={"HOSTILE_PID_DIR": str(pids)})
    return out, pids


def test_every_cell_of_a_hostile_matrix_has_exactly_one_record(hostile_run):
    run, _ = hostile_run
    recs = read_records(run / "results.jsonl")   # raises on a cell recorded twice
    assert sorted(r.case for r in recs) == sorted(
        ["exits_zero", "os_exit_zero", "forks", "forks_and_holds", "floods", "hogs", "conv_bn"])
    meta = read_run_meta(run)
    assert meta.finished
    # exits_zero and os_exit_zero kill 2 workers each, hogs 1 (a memory kill is not retried).
    assert list(meta.environments.values())[0]["worker_restarts"] == 5


def test_a_case_that_ends_the_worker_with_status_0_is_a_crash_after_one_retry(hostile_run):
    recs = {r.case: r for r in read_records(hostile_run[0] / "results.jsonl")}
    for case in ("exits_zero", "os_exit_zero"):
        rec = recs[case]
        assert (rec.status, rec.stage) == ("crash", "reference"), rec   # it exits while built
        assert "exited with code 0 before its last event" in rec.error
        assert rec.notes and rec.notes[0].startswith("2 workers died on this cell")


def test_forked_processes_neither_record_nor_survive(hostile_run):
    run, pids = hostile_run
    recs = {r.case: r for r in read_records(run / "results.jsonl")}
    # The forked copy of the worker never sent its own record; the daemon (double fork, setsid,
    # holding the worker's pipes) neither stalled the run nor outlived it.
    assert recs["forks"].status == "pass" and recs["forks_and_holds"].status == "pass"
    for name in ("forks-child", "daemon"):
        pid = int((pids / f"{name}.pid").read_text())
        assert not alive(pid), f"{name} (pid {pid}) is still running"


def test_a_stdout_flood_is_capped_in_the_log_and_the_bundle(hostile_run):
    run, _ = hostile_run
    rec = {r.case: r for r in read_records(run / "results.jsonl")}["floods"]
    assert (rec.status, rec.stage) == ("fail", "reference") and "failed after flooding" in rec.error
    log = Path(rec.log).read_bytes()
    assert len(log) <= 2**20 + 256                          # log_max_mb: 1
    assert b"bytes cut" in log and b"failed after flooding stdout" in log.split(b"bytes cut")[1]
    cut = int(log.split(b"[... ")[1].split(b" bytes cut")[0])
    assert cut > 199 * 2**20                                # 200 MiB written, 1 MiB kept
    assert (Path(rec.bundle) / "cell.log").read_bytes() == log


def test_a_memory_hog_is_stopped_at_cell_memory_mb(hostile_run):
    rec = {r.case: r for r in read_records(hostile_run[0] / "results.jsonl")}["hogs"]
    assert rec.status == "crash" and rec.error.startswith("MemoryLimit:")
    assert "cell_memory_mb=2000" in rec.error


def test_a_second_runner_on_the_same_run_is_refused_with_the_holders_pid(tmp_path):
    reports = tmp_path / "reports"
    # One verdict worker: while it is in the slow case, the first runner has written nothing yet.
    first = start_runner("--reports", str(reports), "--jobs", "1")
    try:
        wait_for(lambda: list(reports.glob("runs/*/logs/*slow*.log")), "the first runner in its slow case")
        run = next(reports.glob("runs/*"))
        for args in (("--output", str(run)), ("--resume",)):
            second = harness("matrix", "--config", str(SIGNALS), "--reports", str(reports), *args, check=False)
            assert second.returncode == 2, second.stderr
            assert f"in use by another runner (pid {first.pid} " in second.stderr
    finally:
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 128 + signal.SIGINT
    assert read_records(run / "results.jsonl") == []   # the refused runners wrote nothing


def test_sigterm_ends_the_workers_and_leaves_the_run_resumable(tmp_path):
    run = tmp_path / "run"
    runner = start_runner("--output", str(run))
    try:
        wait_for(lambda: list(run.glob("logs/*slow*.log")), "the worker in its slow case")
        workers = psutil.Process(runner.pid).children(recursive=True)
        assert workers
        runner.send_signal(signal.SIGTERM)
        code = runner.wait(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert code == 128 + signal.SIGTERM, runner.stderr.read()[-3000:]
    assert not [p.pid for p in workers if alive(p.pid)]
    assert not read_run_meta(run).finished
    harness("matrix", "--config", str(SIGNALS), "--output", str(run), env={"HOSTILE_SLOW_S": "0"})
    recs = read_records(run / "results.jsonl")
    assert sorted((r.case, r.status) for r in recs) == [("conv_bn", "pass"), ("slow", "pass")]
    assert read_run_meta(run).finished
