from __future__ import annotations

import json

import pytest

from harness.core.record import (
    Record,
    RecordError,
    SchemaError,
    append_record,
    cut_torn_tail,
    read_records,
)


def rec(**kw) -> Record:
    base = dict(run_id="r1", case="mha", torch="2.13.0", exporter="dynamo", opset=18,
                runtime="ort-cpu", status="pass")
    return Record(**{**base, **kw})


def test_roundtrip_and_append(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, rec(parity={"max_abs": 1e-7}))
    append_record(path, rec(status="fail", stage="export", error="E: boom", opset=17))
    out = read_records(path)
    assert [r.status for r in out] == ["pass", "fail"]
    assert out[0].parity.max_abs == 1e-7 and out[1].stage == "export"
    line = json.loads(path.read_text().splitlines()[0])
    for key in ("schema", "run_id", "case", "torch", "exporter", "opset", "runtime", "status",
                "stage", "error", "parity", "latency_ms", "versions", "duration_s"):
        assert key in line


def test_torn_last_line_is_reported_and_not_read(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, rec())
    size = path.stat().st_size
    with open(path, "a") as fh:
        fh.write('{"run_id": "r1", "case": "mh')
    said: list[str] = []
    assert len(read_records(path, warn=said.append)) == 1
    assert said and f"torn last line at byte {size}" in said[0] and str(path) in said[0]


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


GOOD = rec().to_dict()


@pytest.mark.parametrize("line, why", [
    ("[1, 2, 3]", "expected a JSON object, got an array"),
    ("{}", "'run_id' is missing"),
    ('"text"', "got a string"),
    ("{not json", "not valid JSON"),
    (json.dumps({**GOOD, "schema": "abc"}), "'schema' must be an integer"),
    (json.dumps({**GOOD, "schema": True}), "'schema' must be an integer"),
    (json.dumps({**GOOD, "status": "weird"}), "'status' must be one of pass, fail"),
    (json.dumps({**GOOD, "case": None}), "'case' must be a non-empty string"),
    (json.dumps({**GOOD, "torch": 2.13}), "'torch' must be a non-empty string"),
    (json.dumps({**GOOD, "opset": "17"}), "'opset' must be an integer"),
    (json.dumps({**GOOD, "runtime": ""}), "'runtime' must be a non-empty string"),
    (json.dumps({**GOOD, "exporter": ["dynamo"]}), "'exporter' must be a non-empty string"),
    (json.dumps({**GOOD, "parity": {"max_abs": "big"}}), "'parity.max_abs' must be a number"),
    (json.dumps({**GOOD, "latency_ms": {"samples": [1, "x"]}}), "'latency_ms.samples' must be a list of numbers"),
    (json.dumps({**GOOD, "options": [1]}), "'options' must be an object"),
    (json.dumps({**GOOD, "notes": "one"}), "'notes' must be a list of strings"),
])
def test_a_bad_line_anywhere_is_an_error_naming_file_and_line(tmp_path, line, why):
    path = tmp_path / "results.jsonl"
    append_record(path, rec(opset=13))
    with open(path, "a") as fh:
        fh.write(line + "\n")
    append_record(path, rec(opset=17))
    with pytest.raises(RecordError) as info:
        read_records(path)
    assert str(info.value).startswith(f"{path}:2: ") and why in str(info.value)
    assert isinstance(info.value, SchemaError)   # the CLI's one line and exit 2


def test_a_cell_recorded_twice_is_an_error_not_counted_twice(tmp_path):
    path = tmp_path / "results.jsonl"
    for _ in range(2):
        append_record(path, rec())
    with pytest.raises(RecordError, match=r":2: cell torch2.13.0-mha-dynamo-op18-ort-cpu is recorded twice \(first at line 1\)"):
        read_records(path)


def test_null_parts_read_as_absent_and_a_missing_cell_id_is_derived(tmp_path):
    path = tmp_path / "results.jsonl"
    data = {**GOOD, "parity": None, "latency_ms": None, "cell_id": None}
    path.write_text(json.dumps(data) + "\n")
    (r,) = read_records(path)
    assert not r.parity and not r.latency_ms and r.cell_id == "torch2.13.0-mha-dynamo-op18-ort-cpu"


def test_append_cuts_a_torn_tail_first_and_says_where(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    append_record(path, rec(opset=13))
    size = path.stat().st_size
    with open(path, "a") as fh:
        fh.write('{"run_id": "r1", "case": "mh')      # a kill inside write()
    append_record(path, rec(opset=17))
    assert f"cut a torn last line at byte {size}" in capsys.readouterr().err
    assert [r.opset for r in read_records(path)] == [13, 17]


def test_cut_torn_tail_keeps_a_whole_record_that_only_lacks_its_newline(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(rec().to_json())
    assert cut_torn_tail(path) is None
    assert path.read_text().endswith("}\n") and len(read_records(path)) == 1


def test_a_bad_record_from_a_worker_is_refused_by_the_same_validation():
    with pytest.raises(RecordError, match="'status' must be one of"):
        Record.from_dict({**GOOD, "status": "weird"})


def test_stage_is_an_enum_stored_as_its_plain_value():
    from harness.core.status import Stage

    rec = Record.from_dict({"run_id": "r", "case": "c", "torch": "2.13.0", "exporter": "dynamo", "opset": 18,
                            "runtime": "ort-cpu", "status": "fail", "stage": "parity"})
    assert rec.stage is Stage.PARITY and rec.stage == "parity"
    assert json.loads(rec.to_json())["stage"] == "parity"
    with pytest.raises(RecordError, match="stage"):
        Record.from_dict({**rec.to_dict(), "stage": "exporting"})


def test_the_binding_overhead_keeps_its_stored_key(tmp_path):
    """``Latency.binding_overhead_ms`` was ``floor_ms`` before "floor" meant only a runtime floor:
    a stored record reads into the new name and is written back with the key it was stored with."""
    stored = {"median": 0.0121, "floor_ms": 0.0086, "iterations": 200}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec(latency_ms=stored).to_dict()) + "\n")
    (back,) = read_records(path)
    assert back.latency_ms.binding_overhead_ms == 0.0086 and not back.latency_ms.extra
    assert json.loads(back.to_json())["latency_ms"] == stored
