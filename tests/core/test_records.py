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


@pytest.mark.parametrize("samples", [[0.1, True], [1, 2.5, None], [0.1, [0.2]]])
def test_samples_are_numbers_and_never_booleans(tmp_path, samples):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({**GOOD, "latency_ms": {"samples": samples}}) + "\n")
    with pytest.raises(RecordError, match="'latency_ms.samples' must be a list of numbers"):
        read_records(path)


def test_a_file_read_again_gives_records_of_its_own_and_a_changed_file_is_read_anew(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, rec(latency_ms={"median": 0.5, "samples": [0.5, 0.6]}))
    first = read_records(path)
    first[0].status, first[0].latency_ms.samples[0] = "fail", 9.0     # a caller changes its copy
    again = read_records(path)
    assert again[0].status == "pass" and again[0].latency_ms.samples == [0.5, 0.6]
    assert again[0] is not first[0] and read_records(path)[0] is not again[0]
    # The same size, another byte: read anew, not the records kept for the earlier bytes.
    path.write_bytes(path.read_bytes().replace(b'"pass"', b'"fail"'))
    assert [r.status for r in read_records(path)] == ["fail"]
    # A torn tail is said on every read, never kept quiet by an earlier one.
    with open(path, "a") as fh:
        fh.write('{"run_id": "r1"')
    said: list[str] = []
    read_records(path, warn=said.append)
    read_records(path, warn=said.append)
    assert len(said) == 2 and all("torn last line" in s for s in said)


def test_lines_read_before_are_not_parsed_again_in_any_order(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    for opset in (13, 17, 18):
        append_record(path, rec(opset=opset))
    before = read_records(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(reversed(lines)))          # what finalize's sort does
    parsed: list[dict] = []
    real = Record.from_dict.__func__
    monkeypatch.setattr(Record, "from_dict", classmethod(lambda cls, d: (parsed.append(d), real(cls, d))[1]))
    after = read_records(path)
    assert [r.opset for r in after] == [18, 17, 13] and parsed == []
    assert [r.to_json() for r in reversed(after)] == [r.to_json() for r in before]
    # A line changed by a pass (a remedy added): that line alone is parsed again.
    path.write_bytes(path.read_bytes().replace(b'"notes": []', b'"notes": ["a remedy"]', 1))
    assert [r.notes for r in read_records(path)] == [["a remedy"], [], []] and len(parsed) == 1
