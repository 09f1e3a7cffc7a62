"""A real small matrix into one store: verdicts in parallel equal serial ones and a direct
export-and-run; an unchanged re-run is served by the cell cache; --fresh=latency times again."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT, TESTS, env_python, run_harness

from harness.core.record import read_records
from harness.core.status import Status
from harness.store.runs import read_run_meta

pytestmark = pytest.mark.e2e
CONFIG = TESTS / "matrices" / "cache.yaml"
PROBES = {"mha": "attention", "repeat_interleave": "shapes", "conv_bn": "vision"}


def verdicts(records):
    return {r.cell_id: (r.status.value, r.stage) for r in records}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Runs of cache.yaml into one store: parallel (cold), the same again (warm), serial
    (--fresh --jobs 1), --fresh=latency, then with one more torch release."""
    reports = tmp_path_factory.mktemp("cache") / "reports"
    # The nightly case: the same matrix with one more torch release.
    nightly = reports.parent / "nightly.yaml"
    nightly.write_text(CONFIG.read_text().replace('torch: ["2.13.0"]', 'torch: ["2.6.0", "2.13.0"]'))
    runs = {}
    for name, config, args in (("parallel", CONFIG, ["--jobs", "2"]), ("warm", CONFIG, []),
                               ("serial", CONFIG, ["--fresh", "--jobs", "1"]),
                               ("latency", CONFIG, ["--fresh=latency"]), ("nightly", nightly, [])):
        proc = run_harness("--reports", str(reports), "matrix", "--config", str(config), *args)
        run_dir = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("run directory"))
        runs[name] = (read_run_meta(run_dir), read_records(f"{run_dir}/results.jsonl"))
    return runs


def test_parallel_and_serial_verdicts_are_the_same(store):
    (pmeta, parallel), (smeta, serial) = store["parallel"], store["serial"]
    assert pmeta.extra["schedule"]["jobs"] == 2 and smeta.extra["schedule"]["jobs"] == 1
    assert len(parallel) == 12 and verdicts(parallel) == verdicts(serial)
    assert not any(r.cached_from for r in serial)                  # --fresh: nothing reused
    assert all(r.latency_ms.median for r in parallel if r.status is Status.PASS)
    assert [r.cell_id for r in parallel] == [r.cell_id for r in serial]   # plan order, both


def test_an_unchanged_rerun_is_served_by_the_cache(store):
    (pmeta, parallel), (wmeta, warm) = store["parallel"], store["warm"]
    assert verdicts(warm) == verdicts(parallel)
    assert {r.cached_from for r in warm} == {pmeta.run_id}
    assert wmeta.extra["schedule"]["cached"] == len(warm) == 12
    first = {r.cell_id: r for r in parallel}
    for r in warm:
        assert r.run_id == wmeta.run_id and r.cache_key == first[r.cell_id].cache_key
        assert r.latency_ms.median == first[r.cell_id].latency_ms.median
        assert r.notes[-1].startswith(f"taken from run {pmeta.run_id}")


def test_fresh_latency_runs_passing_cells_again_and_reuses_the_rest(store):
    (_, serial), (_, again) = store["serial"], store["latency"]
    assert verdicts(again) == verdicts(serial)
    for r in again:
        if r.status is Status.PASS:
            assert r.cached_from is None and r.latency_ms.median
        else:
            assert r.cached_from == serial[0].run_id       # the newest run holding the cell


def test_parallel_verdicts_match_a_direct_export_and_onnxruntime_run(store, tmp_path):
    meta, records = store["parallel"]
    items = [{"case_file": str(ROOT / "harness" / "probes" / f"{PROBES[r.case]}.py"), "case_fn": r.case,
              "exporter": r.exporter, "opset": r.opset, "cell_id": r.cell_id} for r in records]
    job, out = tmp_path / "direct.json", tmp_path / "direct.jsonl"
    job.write_text(json.dumps(items))
    proc = subprocess.run([str(env_python(meta, "2.13.0")), str(TESTS / "direct_verdict.py"), str(job), str(out)],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    direct = {v["cell_id"]: (v["status"], v["stage"]) for v in map(json.loads, out.read_text().splitlines())}
    assert len(direct) == len(records), proc.stderr[-3000:]
    assert direct == verdicts(records)


def test_one_more_torch_release_runs_only_that_release(store):
    (_, latest), (meta, nightly) = store["latency"], store["nightly"]
    new = [r for r in nightly if r.torch == "2.6.0"]
    old = [r for r in nightly if r.torch == "2.13.0"]
    assert len(new) == len(old) == 12 and meta.extra["schedule"]["cached"] == 12
    assert not any(r.cached_from for r in new) and all(r.cached_from for r in old)
    assert verdicts(old) == verdicts(latest)


def test_every_figure_is_checked_in_a_second_fresh_process(store):
    """The same file in the same stack timed twice, by two fresh latency workers: the two agree
    within the stated interval (at least the 5 % spread), or the cell was timed in more processes
    and says so (harness.run.confirm). Figures taken on a loaded machine are not checked."""
    from harness.core.record import Latency
    from harness.run.confirm import agree

    checked = 0
    for name in ("parallel", "serial", "latency", "nightly"):
        meta, records = store[name]
        timed = [r for r in records if r.status is Status.PASS and not r.latency_ms.loaded and not r.cached_from]
        checks = meta.extra["latency_checks"]
        assert checks["checked"] == len(timed), name
        # The overhead is the first worker's (the confirming ones measure none): kept on every figure.
        assert all(r.latency_ms.binding_overhead_ms for r in timed), name
        assert sum(len(r.latency_ms.processes) == 1 for r in timed) == checks["unchecked"]   # second one loaded
        settled = [r for r in timed if (r.latency_ms.unstable_why or "").startswith("two fresh processes disagree")]
        assert checks["disagreed"] == len(settled)
        for r in (r for r in timed if len(r.latency_ms.processes) > 1):
            lat = r.latency_ms
            checked += 1
            if r in settled:
                assert 2 <= len(lat.processes) <= 2 + 4 and lat.unstable
                assert min(lat.processes) <= lat.median <= max(lat.processes)
                assert not agree(Latency(median=lat.processes[0]), Latency(median=lat.processes[1]), 0.05)
            else:
                first = Latency(median=lat.processes[0], ci_low=lat.ci_low, ci_high=lat.ci_high)
                assert round(lat.median, 6) == lat.processes[0] and len(lat.processes) == 2   # stored to 6 digits
                assert agree(first, Latency(median=lat.processes[1]), 0.05), (r.cell_id, lat.processes)
    if not checked:
        pytest.skip("every figure was taken on a loaded machine: none could be checked here")
