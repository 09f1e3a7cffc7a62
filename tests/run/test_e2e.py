"""A real matrix over two torch versions (2.13.0 from local disk, 2.6.0 from the index)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, TESTS, env_python, run_harness

from harness.core.wire import WORKER_MODULE

pytestmark = pytest.mark.e2e


def find(records, **axes):
    out = [r for r in records if all(str(getattr(r, k)) == str(v) for k, v in axes.items())]
    assert out, f"no record for {axes}"
    return out


def test_every_planned_cell_has_one_record(e2e_records):
    assert len(e2e_records) == 2 * 2 * 3 * 9
    assert len({r.cell_id for r in e2e_records}) == len(e2e_records)
    assert {r.torch for r in e2e_records} == {"2.6.0", "2.13.0"}
    # The matrix's own code failed on none of them (an `error` is a bug of the project).
    assert [r.cell_id for r in e2e_records if r.status.is_own_error] == []


@pytest.mark.parametrize("torch_version", ["2.6.0", "2.13.0"])
def test_mha_torchscript_opset13_fails_at_export_on_sdpa(e2e_records, torch_version):
    (r,) = find(e2e_records, torch=torch_version, case="mha", exporter="torchscript", opset=13)
    assert (r.status, r.stage) == ("fail", "export")
    assert "scaled_dot_product_attention" in r.error and "opset version 13" in r.error
    assert r.hint and "opset" in r.hint


@pytest.mark.parametrize("torch_version", ["2.6.0", "2.13.0"])
def test_mha_torchscript_dynamic_axes_only_work_at_export_shape(e2e_records, torch_version):
    # pytorch/pytorch#128610: the TorchScript graph bakes batch/seq from the dummy input
    for opset in (17, 18):
        (r,) = find(e2e_records, torch=torch_version, case="mha", exporter="torchscript", opset=opset)
        assert (r.status, r.stage) == ("fail", "run")
        assert "second shape" in r.error


def test_conv_bn_baseline_passes_with_parity_and_latency(e2e_records):
    for r in find(e2e_records, case="conv_bn", exporter="torchscript"):
        assert r.status == "pass", r.error
        assert r.parity.max_abs < 1e-4 and len(r.parity.shapes) == 2
        lat = r.latency_ms
        assert lat.iterations >= 20 and lat.min <= lat.median <= lat.p90
        assert r.graph["nodes"] > 0 and r.opset_actual == r.opset


def test_one_file_is_timed_once_per_environment_and_runtime(e2e_records):
    """Cells whose exported files are byte for byte the same (torch's dynamo exporter writes one
    opset-18 file for several asked opsets where it cannot convert down) carry one timing, marked with the cell that took it;
    cells whose files differ never share one."""
    timed = [r for r in e2e_records if r.status == "pass" and r.latency_ms.median]
    by_cell = {r.cell_id: r for r in timed}
    files: dict[tuple, list] = {}
    for r in timed:
        files.setdefault((r.env, r.runtime, (r.export_made or {}).get("sha256") or r.cell_id), []).append(r)
    shared = [rs for rs in files.values() if len(rs) > 1]
    assert shared, "no two cells of this matrix wrote the same file"
    for rs in files.values():
        firsts = [r for r in rs if r.latency_ms.same_file_as is None]
        assert len(firsts) == 1, [r.cell_id for r in rs]
        for r in rs:
            if r is not firsts[0]:
                assert r.latency_ms.same_file_as == firsts[0].cell_id
                assert (r.latency_ms.median, r.latency_ms.samples) == (firsts[0].latency_ms.median,
                                                                      firsts[0].latency_ms.samples)
    for r in timed:
        if r.latency_ms.same_file_as:
            assert by_cell[r.latency_ms.same_file_as].export_made["sha256"] == r.export_made["sha256"]


def test_user_file_case_runs(e2e_records):
    rs = find(e2e_records, case="tiny_mlp")
    assert rs and all(r.status == "pass" for r in rs), [(r.cell_id, r.error) for r in rs if r.status != "pass"]


def test_records_carry_versions_and_durations(e2e_records):
    for r in e2e_records:
        assert r.versions["torch"] == r.torch
        assert r.versions.get("onnx") and r.versions.get("python")
        assert "export" in r.duration_s
        if r.status == "pass":
            assert set(r.duration_s) >= {"export", "check", "load", "run", "parity", "latency"}
            assert r.versions.get("runtime")


def test_failed_cells_have_logs_and_bundles(e2e_records):
    failed = [r for r in e2e_records if r.status == "fail"]
    assert failed
    for r in failed:
        assert Path(r.log).exists() and "Traceback" in Path(r.log).read_text()
        assert r.bundle and (Path(r.bundle) / "inputs.npz").exists()
        assert r.repro and f"-m {WORKER_MODULE} --job" in r.repro
        assert r.signature


def test_run_json_lists_installed_packages(e2e_meta):
    assert e2e_meta.finished and e2e_meta.ended >= e2e_meta.started
    assert len(e2e_meta.environments) == 2
    for env in e2e_meta.environments.values():
        installed = " ".join(env["installed"])
        assert "torch==" in installed and "onnxruntime==" in installed and "numpy==" in installed


def test_markdown_matrix(e2e_run, e2e_records):
    md = (e2e_run / "matrix.md").read_text()
    assert "Legend" in md and "torch 2.6.0" in md and "torch 2.13.0" in md
    n_fail = sum(r.status == "fail" for r in e2e_records)
    assert f"fail {n_fail}" in md
    assert "Failures by signature" in md


def test_verdicts_match_a_direct_export_and_onnxruntime_run(e2e_records, e2e_meta, tmp_path):
    """Every harness verdict at opsets 13 and 18 equals what plain torch.onnx.export + onnxruntime
    says (opset 17's cells take the same paths with another opset argument; CI's time)."""
    file_cases = {name: TESTS / "cases" / "user_models.py"
                  for name in ("tiny_mlp", "shape_baked", "two_out", "dict_out", "batch_one", "shape_branch")}
    probe_files = {"mha": ("attention", "mha"), "repeat_interleave": ("shapes", "repeat_interleave"),
                   "conv_bn": ("vision", "conv_bn")}
    # Both releases' direct runs at once (two processes, one per core), judged one after the other.
    procs = {}
    for torch_version in ("2.6.0", "2.13.0"):
        items = []
        for r in e2e_records:
            if r.torch != torch_version or r.opset not in (13, 18):
                continue
            if r.case in file_cases:
                path, fn = file_cases[r.case], r.case
            else:
                mod, fn = probe_files[r.case]
                path = ROOT / "harness" / "probes" / f"{mod}.py"
            items.append({"case_file": str(path), "case_fn": fn, "exporter": r.exporter,
                          "opset": r.opset, "cell_id": r.cell_id})
        job = tmp_path / f"direct-{torch_version}.json"
        job.write_text(json.dumps(items))
        py = env_python(e2e_meta, torch_version)
        out = tmp_path / f"direct-{torch_version}.jsonl"
        log = tmp_path / f"direct-{torch_version}.log"
        with open(log, "w") as stream:   # a file, not a pipe: neither process waits on the other's reader
            procs[torch_version] = (items, out, log, subprocess.Popen(
                [str(py), str(TESTS / "direct_verdict.py"), str(job), str(out)], stdout=stream, stderr=stream,
                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}))
    for torch_version, (items, out, log, proc) in procs.items():
        proc.wait()
        stderr = log.read_text(errors="replace")
        direct = {v["cell_id"]: v for v in map(json.loads, out.read_text().splitlines())}
        assert items and len(direct) == len(items), stderr[-3000:]
        by_id = {r.cell_id: r for r in e2e_records}
        mismatches = [(cid, (by_id[cid].status, by_id[cid].stage), (v["status"], v["stage"]), v["error"])
                      for cid, v in direct.items()
                      if (by_id[cid].status, by_id[cid].stage) != (v["status"], v["stage"])]
        assert not mismatches


def test_warm_rerun_reuses_environments(e2e_run, tmp_path):
    out = tmp_path / "warm"
    run_harness("matrix", "--config", str(TESTS / "matrices" / "e2e.yaml"), "--output", str(out),
                "--only", "case=conv_bn,opset=18,exporter=torchscript")
    meta = json.loads((out / "run.json").read_text())
    assert meta["environments"] and all(e["reused"] for e in meta["environments"].values())
