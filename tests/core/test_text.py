"""Any text a case produces can be hashed, written and shown; names make bounded file names."""
from __future__ import annotations

import json
import os

from harness.core.cell import CellKey
from harness.core.record import Record, append_record, read_records
from harness.core.status import Status
from harness.core.text import NAME_LIMIT, bounded_name, encode_text, safe_text
from harness.run.annotate import signature

# What os.fsdecode makes of a file name that is not UTF-8: lone surrogates U+DCFF, U+DCFE.
UNDECODABLE = os.fsdecode(b"weights-\xff\xfe.bin")


def test_lone_surrogates_become_escapes_and_other_text_is_unchanged():
    assert UNDECODABLE == "weights-\udcff\udcfe.bin"
    assert safe_text(UNDECODABLE) == "weights-\\xff\\xfe.bin"
    assert safe_text("half a pair \ud83d here") == "half a pair \\ud83d here"
    text = "ünïcödé 😀 \u202e and \\x escapes"
    assert safe_text(text) is text
    # Every str encodes (the bytes a hash or a raw write gets), never raising.
    assert encode_text(UNDECODABLE) == b"weights-\\xff\\xfe.bin"
    assert encode_text("\udc80\ud800x") == b"\\x80\\ud800x"


def test_bounded_name_keeps_short_names_and_hashes_long_ones():
    assert bounded_name("torch2.13.0-conv_bn-dynamo-op18-ort-cpu") == "torch2.13.0-conv_bn-dynamo-op18-ort-cpu"
    assert bounded_name("a b/c") == "a_b_c"
    a, b = bounded_name("x" * 1000 + "a"), bounded_name("x" * 1000 + "b")
    assert len(a) == len(b) == NAME_LIMIT and a != b
    assert a.startswith("xxx") and a == bounded_name("x" * 1000 + "a")   # stable
    assert len(bounded_name(UNDECODABLE * 50).encode()) <= NAME_LIMIT


def test_cell_ids_are_bounded_file_names():
    short = CellKey("conv_bn", "dynamo", 18, "ort-cpu")
    assert short.cell_id("2.13.0") == "torch2.13.0-conv_bn-dynamo-op18-ort-cpu"   # ids as before
    long = CellKey("n" * 1000, "dynamo", 18, "ort-cpu")
    cid = long.cell_id("2.13.0")
    assert len(cid) == NAME_LIMIT and cid.startswith("torch2.13.0-nnn")
    assert cid != CellKey("n" * 999, "dynamo", 18, "ort-cpu").cell_id("2.13.0")


def test_export_group_ids_are_bounded_file_names():
    from harness.core.env import EnvSpec
    from harness.matrix.config import CaseEntry
    from harness.matrix.plan import Cell, EnvPlan

    # Past the config check (which refuses such a name): the file name stays bounded anyway.
    case = CaseEntry.model_construct(target="conv_bn", name="n" * 1000, atol=None, rtol=None)
    key = CellKey(case.label, "torchscript", 17, "ort-cpu")
    cell = Cell(key=key, torch="2.13.0", runtime_name="ort-cpu", case_ref="conv_bn", atol=None, rtol=None)
    env = EnvSpec(name="torch2.13.0-cpu-0b1efe24", torch="2.13.0", python="3.11", family="cpu",
                  packages=["torch==2.13.0"], runtimes=["ort-cpu"])
    (group,) = EnvPlan(env, [cell]).groups()
    assert len(f"{group.gid}.onnx.data") < 255 and group.gid.startswith("torch2.13.0-cpu-0b1efe24-nnn")


def rec(**kw) -> Record:
    base = dict(run_id="r1", case="mha", torch="2.13.0", exporter="dynamo", opset=18,
                runtime="ort-cpu", status="fail", stage="reference")
    return Record(**{**base, **kw})


def test_a_record_holds_its_texts_safe_to_encode(tmp_path):
    r = rec(error=f"FileNotFoundError: cannot open {UNDECODABLE}", notes=[f"note {UNDECODABLE}"])
    assert r.error == "FileNotFoundError: cannot open weights-\\xff\\xfe.bin"
    assert r.notes == ["note weights-\\xff\\xfe.bin"]
    assert signature(r).startswith("reference:")
    # Read back from JSON that carries a surrogate escape (another writer's results.jsonl).
    data = {**r.to_dict(), "error": f"E: {UNDECODABLE}", "cell_id": "c1"}
    assert json.dumps(data).count("\\udcff") == 1
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(data) + "\n")
    (back,) = read_records(path)
    assert back.error == "E: weights-\\xff\\xfe.bin" and back.status is Status.FAIL


def test_text_set_after_construction_still_hashes_and_writes(tmp_path):
    r = rec()
    r.error = f"RuntimeError: {UNDECODABLE}"   # bypasses the record's own cleaning
    r.hint = UNDECODABLE
    assert signature(r).startswith("reference:")
    path = tmp_path / "results.jsonl"
    append_record(path, r)
    (back,) = read_records(path)
    assert back.error == "RuntimeError: weights-\\xff\\xfe.bin"
