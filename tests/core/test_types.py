"""The boundary types: one identity, JSON round-trips that keep schema v1's keys."""
from __future__ import annotations

import json

import pytest

from harness.core.cell import CaseRef, CellKey, ExportOptions
from harness.core.env import EnvMarker, EnvSpec
from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
from harness.core.record import Latency, Parity, Record
from harness.core.run import RunMeta
from harness.core.status import Status


def test_export_options_suffix_and_label_agree():
    opts = ExportOptions(dynamic=False, constant_folding=False, precision="fp16")
    assert opts.suffix == "-static-nofold-fp16" and opts.label == "static,nofold,fp16"
    assert ExportOptions().suffix == "" and ExportOptions().label == ""
    assert ExportOptions.from_dict(opts.to_dict()) == opts
    # Keys a record carries besides the options (x_ extras) do not change the identity.
    assert ExportOptions.from_dict({**opts.to_dict(), "x_other": 1}) == opts


def test_cell_id_is_the_first_release_format():
    key = CellKey("mha", "torchscript", 17, "openvino@2026.3.1", ExportOptions(dynamic=False))
    assert key.cell_id("2.13.0") == "torch2.13.0-mha-torchscript-op17-static-openvino@2026.3.1"
    weird = CellKey("a b/../c", "dynamo", 18, "ort-cpu")
    assert "/" not in weird.cell_id("2.6.0") and " " not in weird.cell_id("2.6.0")


def test_record_key_matches_the_planned_key():
    key = CellKey("conv_bn", "dynamo", 18, "ort-cpu", ExportOptions(precision="bf16"))
    rec = Record.for_cell("r", key, "2.13.0", "env", Status.PASS)
    assert rec.key == key and rec.cell_id == key.cell_id("2.13.0")
    assert Record.from_dict(json.loads(rec.to_json())).key == key


def test_record_json_keeps_schema_v1_keys_and_types():
    rec = Record.for_cell("r", CellKey("c", "dynamo", 18, "ort-cpu"), "2.13.0", "env", Status.FAIL,
                          stage="parity", error="ParityError: x")
    data = json.loads(rec.to_json())
    assert data["status"] == "fail" and data["parity"] == {} and data["latency_ms"] == {}
    rec.parity = Parity(max_abs=1e-3, atol=1e-4, rtol=1e-3, shapes=[{"max_abs": 1e-3}])
    rec.latency_ms = Latency(median=1.0, p90=1.2, samples=[1.0, 1.1], threads=1, extra={"future": 3})
    data = json.loads(rec.to_json())
    assert data["parity"]["max_abs"] == 1e-3 and data["latency_ms"]["future"] == 3
    back = Record.from_dict(data)
    assert back.status is Status.FAIL and back.parity == rec.parity and back.latency_ms == rec.latency_ms


def test_status_is_a_str_enum_but_hashes_by_member():
    assert Status.PASS == "pass" and f"{Status.XFAIL}" == "xfail"
    assert Status("crash").worker_died and Status.XPASS.passed and not Status.SKIP.attempted
    with pytest.raises(ValueError):
        Status("weird")


def test_job_round_trips_through_json(tmp_path):
    group = ExportGroup(gid="g1", case="mha", case_ref="harness.probes.attention:mha", exporter="dynamo",
                        opset=18, options=ExportOptions(dynamic=False), atol=1e-3,
                        cells=(CellJob("id1", "ort-cpu", "ort-cpu"),
                               CellJob("id2", "openvino@1", "openvino", {"k": 1})))
    job = Job(run_id="r", run_dir=str(tmp_path), env="e", groups=(group,), threads=2,
              latency=LatencyProtocol(min_runs=5))
    back = Job.read(job.write(tmp_path / "job.json"))
    assert back == job
    assert back.groups[0].key(back.groups[0].cells[1]) == CellKey("mha", "dynamo", 18, "openvino@1",
                                                                  ExportOptions(dynamic=False))
    assert back.groups[0].only("id2").cells == (group.cells[1],)
    # A job file from the first release (extra keys such as "provider") still reads.
    data = json.loads((tmp_path / "job.json").read_text())
    data["provider"] = "venv"
    assert Job.from_dict(data) == job


def test_latency_protocol_rejects_nonsense():
    with pytest.raises(ValueError):
        LatencyProtocol(min_runs=0)
    with pytest.raises(ValueError):
        LatencyProtocol(warmup_s=-1)


def test_run_meta_round_trip_keeps_unknown_keys(tmp_path):
    meta = RunMeta.start("run1", "0.1.0", tmp_path / "m.yaml", "abc", {"cells": 1})
    meta.extra["shards"] = [{"run_id": "a"}]
    meta.write(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["shards"] == [{"run_id": "a"}] and "extra" not in data and "fingerprint" not in data
    assert RunMeta.from_dict(data) == meta


def test_env_marker_keeps_provider_facts():
    spec = EnvSpec("e", "2.13.0", "3.11", "cpu", ["torch==2.13.0"], ["ort-cpu"])
    marker = EnvMarker.for_spec(spec, provider="docker", installed=["b==1", "a==2"],
                                extra={"image": "t:1"})
    data = marker.to_dict()
    assert data["image"] == "t:1" and data["spec_hash"] == spec.spec_hash
    assert EnvMarker.from_dict(data) == marker
    assert marker.lock_hash == EnvMarker.for_spec(spec, installed=["a==2", "b==1"]).lock_hash


@pytest.mark.parametrize("ref, target, function, is_file", [
    ("models/m.py:enc", "models/m.py", "enc", True),
    ("/abs/path/x.py:f", "/abs/path/x.py", "f", True),
    ("pkg.mod:fn", "pkg.mod", "fn", False),
])
def test_case_ref_syntax(ref, target, function, is_file):
    parsed = CaseRef.parse(ref)
    assert (parsed.target, parsed.function, parsed.is_file) == (target, function, is_file)
    assert str(parsed) == ref


@pytest.mark.parametrize("bad", ["nocolon", "file.py:", ":fn", "m:not an identifier"])
def test_case_ref_rejects(bad):
    with pytest.raises(ValueError):
        CaseRef.parse(bad)
    assert CaseRef.try_parse(bad) is None


def test_env_index_args_carry_every_index_setting():
    spec = EnvSpec("e", "2.13.0", "3.11", "cpu", ["torch==2.13.0"], ["ort-cpu"], find_links=["/w"],
                   index_url="https://i/simple", extra_index_urls=["https://x/simple"])
    assert spec.index_args() == ["--find-links", "/w", "--index-url", "https://i/simple",
                                 "--extra-index-url", "https://x/simple"]
    assert EnvSpec("e", "2.13.0", "3.11", "cpu", [], []).index_args() == []


def test_every_worker_event_round_trips_through_its_json_line():
    """``to_dict`` gives an event's own fields (not ``asdict``'s copy): what the runner reads back
    from the line is the event that was sent, a record's nested values included."""
    from harness.core.events import EVENT_TYPES, CellStart, GroupStart, Hello, RecordDone, event_from_dict

    rec = Record.for_cell("run", CellKey("mha", "dynamo", 18, "ort-cpu"), "2.13.0", "env", Status.PASS)
    rec.latency_ms = Latency(median=0.05, samples=[0.05, 0.051, 0.049], processes=[0.05, 0.052])
    sent = [Hello(pid=7, versions={"torch": "2.13.0"}, fresh=True, preloaded=["torch"], threads=1, scratch="/tmp/x"),
            GroupStart(pid=8, gid="g", parent=7), CellStart(pid=8, cell_id="c"),
            RecordDone(pid=8, record=rec.to_dict())] + [cls(pid=1) for cls in EVENT_TYPES.values()]
    for event in sent:
        line = json.dumps(event.to_dict())
        back = event_from_dict(json.loads(line))
        assert back == event and json.loads(line)["event"] == event.kind
    assert Record.from_dict(event_from_dict(json.loads(json.dumps(sent[3].to_dict()))).record).to_dict() == rec.to_dict()
