"""Gate reports stay well-formed whatever a record holds: junit.xml parses with control
characters (NUL, backspace, escape) in errors and case names; gate.md escapes raw HTML and pipes."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from helpers import BOTH, HOSTILE, TESTS

from harness.cli import main
from harness.gate.output import xml_text

TAG = re.compile(r"<[A-Za-z/!?]")
PIPE = re.compile(r"(?<!\\)\|")


def test_xml_text_keeps_only_characters_xml_can_carry():
    assert xml_text("a\x00b\x08c\x1bd\ud800e\ufffe\tf\ng\U0001F600") == "a\\x00b\\x08c\\x1bd\\ud800e\\ufffe\tf\ng\U0001F600"
    ET.fromstring(f"<x a='{xml_text(chr(0))}'>{xml_text(''.join(map(chr, range(32))))}</x>")


def test_hostile_candidate_gives_well_formed_junit_and_escaped_markdown(store, tmp_path, capsys):
    path = store / "runs" / HOSTILE / "results.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["case"] == "mha" and rec["status"] == "crash":      # the new failure vs BOTH
            rec["error"] = "Crash\x00 in \x08<b>op</b> | col & \x1b[0m\x0c end"
            rec["repro"] = "python -m x --job '/tmp/a\x00b'"
        if rec["case"].startswith("<img"):
            rec["case"] = "pipe|case<i>\x08"
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "gate"
    rc = main(["--reports", str(store), "gate", "--config", str(TESTS / "matrices" / "gate.yaml"),
               "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{HOSTILE}@2.13.0", "--remeasure", "0",
               "--latency-threshold", "inf", "--output", str(out)])
    assert rc == 1   # mha · dynamo · op18 passes on the baseline and crashes on the candidate
    capsys.readouterr()
    raw = (out / "junit.xml").read_bytes()
    suite = ET.fromstring(raw)                     # expat refuses any XML-invalid character
    failure, = [tc.find("failure") for tc in suite if tc.find("failure") is not None]
    assert "Crash\\x00 in \\x08<b>op</b> | col & \\x1b[0m\\x0c end" in failure.get("message")
    assert "\\x00b" in failure.text
    assert any(tc.get("classname") == "gate.pipe|case<i>\\x08" for tc in suite)
    md = (out / "gate.md").read_text(encoding="utf-8")
    assert not TAG.search(md) and not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", md)
    assert "Crash\\x00 in \\x08&lt;b&gt;op&lt;/b&gt; \\| col &amp; \\x1b[0m end" in md   # \\x0c: a space
    assert "pipe\\|case&lt;i&gt;\\x08" in md
    for line in md.splitlines():
        if line.startswith("| "):
            assert len(PIPE.findall(line)) == 7, line   # six columns, however hostile the text


def test_surrogates_in_a_candidate_are_written_out(store, tmp_path, capsys):
    """Lone surrogates (os.fsdecode of a non-UTF-8 name) in a stored record: gate.md, junit.xml
    and gate.json are written, with the undecodable bytes as escapes."""
    path = store / "runs" / HOSTILE / "results.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["case"] == "mha" and rec["status"] == "crash":
            rec["error"] = "FileNotFoundError: weights-\udcff\udcfe.bin"
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    assert "\\udcff" in path.read_text()
    out = tmp_path / "gate"
    rc = main(["--reports", str(store), "gate", "--config", str(TESTS / "matrices" / "gate.yaml"),
               "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{HOSTILE}@2.13.0", "--remeasure", "0",
               "--latency-threshold", "inf", "--output", str(out)])
    assert rc == 1, capsys.readouterr().err
    capsys.readouterr()
    assert "weights-\\xff\\xfe.bin" in (out / "gate.md").read_text(encoding="utf-8")
    failure, = [tc.find("failure") for tc in ET.fromstring((out / "junit.xml").read_bytes())
                if tc.find("failure") is not None]
    assert "weights-\\xff\\xfe.bin" in failure.get("message")
    assert "weights-\\\\xff\\\\xfe.bin" in (out / "gate.json").read_text(encoding="utf-8")
