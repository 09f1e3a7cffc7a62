from __future__ import annotations

import json

import pytest

from harness.core.record import Record, SchemaError, append_record, read_records


def rec(**kw) -> Record:
    base = dict(run_id="r1", case="mha", torch="2.13.0", exporter="dynamo", opset=18,
                runtime="ort-cpu", status="pass")
    return Record(**{**base, **kw})


def test_roundtrip_and_append(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, rec(parity={"max_abs": 1e-7}))
    append_record(path, rec(status="fail", stage="export", error="E: boom"))
    out = read_records(path)
    assert [r.status for r in out] == ["pass", "fail"]
    assert out[0].parity.max_abs == 1e-7 and out[1].stage == "export"
    line = json.loads(path.read_text().splitlines()[0])
    for key in ("schema", "run_id", "case", "torch", "exporter", "opset", "runtime", "status",
                "stage", "error", "parity", "latency_ms", "versions", "duration_s"):
        assert key in line


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, rec())
    with open(path, "a") as fh:
        fh.write('{"run_id": "r1", "case": "mh')
    assert len(read_records(path)) == 1


def test_schema_zero_is_migrated(tmp_path):
    path = tmp_path / "results.jsonl"
    old = {"run_id": "r0", "case": "mha", "torch": "2.6.0", "exporter": "torchscript", "opset": 13,
           "runtime": "ort-cpu", "result": "fail", "stage": "export", "latency": {}}
    path.write_text(json.dumps(old) + "\n")
    (r,) = read_records(path)
    assert r.status == "fail" and r.schema == 1


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({**rec().to_dict(), "schema": 99}) + "\n")
    with pytest.raises(SchemaError, match="upgrade"):
        read_records(path)
