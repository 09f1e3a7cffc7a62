"""Capture reuse (harness.worker.capture_reuse): the opsets of one case, release and options share
torch's capture and translation only where the files are the ones a per-opset call writes.

The proof (e2e): the default matrix's dynamo groups (matrix.yaml) exported both ways on every torch
release of matrix.yaml, one process per release (``python -m harness.worker.capture_proof``), the
files compared byte for byte; where they differ, which parts (graph, initializers, opset imports)."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT

from harness.core.cell import ExportOptions
from harness.core.job import ExportGroup, families


def _group(gid: str, case: str = "mha", opset: int = 17, exporter: str = "dynamo", **options) -> ExportGroup:
    return ExportGroup(gid=gid, case=case, case_ref=f"harness.probes:{case}", exporter=exporter, opset=opset,
                       options=ExportOptions(**options))


def test_families_group_the_opsets_of_one_case_exporter_and_options_in_plan_order():
    groups = [_group("a13", opset=13), _group("b13", case="gru", opset=13), _group("a17"),
              _group("t17", exporter="torchscript"), _group("s17", dynamic=False), _group("a18", opset=18)]
    assert [[g.gid for g in f] for f in families(groups)] == [["a13", "a17", "a18"], ["b13"], ["t17"], ["s17"]]


def test_the_work_queue_hands_out_a_family_at_a_time():
    from harness.run.workqueue import EnvWork

    work = EnvWork(None, [_group("a13", opset=13), _group("b13", case="gru", opset=13), _group("a17")])
    assert [g.gid for g in work.take_family()] == ["a13", "a17"]
    assert [g.gid for g in work.take_family()] == ["b13"]
    assert work.take_family() == []


def test_refusal_names_why_a_family_exports_per_opset(monkeypatch):
    from harness.worker.capture_reuse import refusal

    opts = ExportOptions()
    assert refusal("dynamo", opts, "2.13.0", 3, forking=True) is None
    assert "torchscript exporter" in refusal("torchscript", opts, "2.13.0", 3, forking=True)
    assert "one opset" in refusal("dynamo", opts, "2.13.0", 1, forking=True)
    assert "torch 2.11.0 is not among" in refusal("dynamo", opts, "2.11.0", 3, forking=True)
    assert "dynamic=False" in refusal("dynamo", ExportOptions(dynamic=False), "2.13.0", 3, forking=True)
    assert "determinism" in refusal("dynamo", opts, "2.13.0", 3, forking=True, determinism=True)
    assert "in the worker itself" in refusal("dynamo", opts, "2.13.0", 3, forking=False)
    monkeypatch.setenv("HARNESS_CAPTURE_REUSE", "0")
    assert "turned off" in refusal("dynamo", opts, "2.13.0", 3, forking=True)


def test_a_family_splits_where_the_release_builds_the_registry_at_another_opset():
    from harness.worker.capture_reuse import by_registry

    groups = [_group(f"a{o}", opset=o) for o in (13, 17, 18, 20, 21)]
    opsets = lambda parts: [[g.opset for g in part] for part in parts]
    # 2.9 and later build the registry at the asked opset above torchlib's 18; 2.6 always at 18.
    assert opsets(by_registry("2.13.0", groups)) == [[13, 17, 18], [20], [21]]
    assert opsets(by_registry("2.9.1+cpu", groups)) == [[13, 17, 18], [20], [21]]
    assert opsets(by_registry("2.6.0", groups)) == [[13, 17, 18, 20, 21]]


def test_export_made_is_written_only_when_known_and_read_back():
    from harness.core.cell import CellKey
    from harness.core.record import Record
    from harness.core.status import Status

    rec = Record.for_cell("r", CellKey("mha", "dynamo", 17, "ort-cpu", ExportOptions()), "2.13.0", "e", Status.PASS)
    assert "export_made" not in rec.to_dict()
    rec.export_made = {"how": "reused-capture", "shared_by": 3, "capture_s": 1.5, "sha256": "ab"}
    assert Record.from_dict(json.loads(rec.to_json())).export_made == rec.export_made


@pytest.mark.e2e
def test_a_shared_capture_writes_the_files_a_per_opset_export_writes_on_every_release_of_the_default_matrix(tmp_path):
    from harness.bench.breakdown import proof_jobs
    from harness.core.wire import CAPTURE_PROOF_MODULE
    from harness.envs.provider import harness_process_env
    from harness.worker.capture_reuse import PROVEN, REUSED, _release

    # Three of the probes, in CI's time: a shared capture on every release (conv_bn), one torch
    # 2.9.1 captures only with its fallback strategies (gru: per-opset there), one no capture
    # takes (control_flow: per-opset, compared by stage and error). All fourteen are compared by
    # `nox -s bench -- --part default_matrix` (docs/performance.md).
    jobs = proof_jobs(ROOT / "matrix.yaml", tmp_path, cases=["conv_bn", "gru", "control_flow"])
    assert set(jobs) == {"2.6.0", "2.9.1", "2.13.0"}, jobs
    # Output to files: the three run at once, and none stalls on a full pipe torch's logs fill.
    procs = {}
    for torch, (python, job, _) in jobs.items():
        out, err = (open(tmp_path / f"{torch}.{k}", "w") for k in ("out", "err"))
        procs[torch] = subprocess.Popen([str(python), "-m", CAPTURE_PROOF_MODULE, "--job", str(job), "--out",
                                         str(tmp_path / f"files-{torch}")], stdout=out, stderr=err, text=True,
                                        env=harness_process_env(1), cwd=ROOT)
        out.close()
        err.close()
    rows, errors = {}, {}
    for torch, proc in procs.items():
        proc.wait(timeout=3000)
        errors[torch] = (tmp_path / f"{torch}.err").read_text(errors="replace")
        assert proc.returncode == 0, errors[torch][-4000:]
        lines = (tmp_path / f"{torch}.out").read_text().splitlines()
        rows[torch] = [r for r in map(json.loads, (x for x in lines if x.startswith("{"))) if "gid" in r]
    for torch, found in rows.items():
        assert len(found) == jobs[torch][2], (torch, len(found), errors[torch][-2000:])
        reused = [r for r in found if r["made"] == REUSED]
        # Each release shares conv_bn's capture (torch.export captures it at the first try).
        assert {r["case"] for r in reused} >= {"conv_bn"}, (torch, [r for r in found if r["made"] != REUSED][:3])
        assert not [r for r in reused if r["case"] == "control_flow"], torch
        # ... and, on each release, the decomposition and translation with it (the registry is
        # at one opset for 13, 17 and 18).
        assert all(r["translation"] == "shared" for r in reused), (torch, [r for r in reused if r["translation"] != "shared"][:3])
        # The per-opset side is torch.onnx's export as it comes; the run's way keeps torchlib's
        # table between exports (group_process.keep_torchlib_table): the bytes must not tell.
        assert {tuple(r["tables"]) for r in found} == {("plain", "kept")}, (torch, found[:2])
        differ = [r for r in found if not r["same"]]
        assert not differ, (torch, differ[:5])
        assert _release(torch) in PROVEN


def test_a_group_goes_on_from_the_familys_translation_only_where_its_registry_is_at_the_same_opset(tmp_path):
    """In-process on the test environment's torch: a family's export stopped after translation;
    opsets 13 and 18 (registry at torchlib's 18) go on from it, opset 20 (registry at 20)
    translates the capture itself; each file is the one a per-opset call writes."""
    import torch

    from harness.worker import group_process as fresh
    from harness.worker.capture_reuse import capture, continuing, file_digest

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x)).softmax(-1)

    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(2, 8)
    kwargs = lambda opset: {"dynamo": True, "opset_version": opset, "input_names": ["x"]}
    family = capture(lambda: torch.onnx.export(model, (x,), str(tmp_path / "family.onnx"), **kwargs(13)))
    assert family.ok and family.translation is not None and family.translation.opset == 18
    assert not (tmp_path / "family.onnx").exists()     # the family's call ended at the translation

    def per_opset(opset: int) -> bool:
        torch.onnx.export(model, (x,), str(tmp_path / f"per{opset}.onnx"), **kwargs(opset))
        return True

    def reused(opset: int) -> bool:
        with continuing(family) as said:
            torch.onnx.export(family.program, (), str(tmp_path / f"reused{opset}.onnx"), **kwargs(opset))
        (tmp_path / f"said{opset}").write_text(said["translation"])
        return True

    for opset, expected in ((13, "shared"), (18, "shared"), (20, "own")):
        assert fresh.in_fresh_copy(lambda: per_opset(opset)) == 0
        assert fresh.in_fresh_copy(lambda: reused(opset)) == 0
        assert (tmp_path / f"said{opset}").read_text() == expected
        assert file_digest(tmp_path / f"reused{opset}.onnx") == file_digest(tmp_path / f"per{opset}.onnx"), opset
