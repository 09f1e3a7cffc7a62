"""matrix.md carries no raw HTML and no table that a cell's text can break, whatever a record
holds (case names, errors, hints, signatures): the hostile fixture run plus control characters
and pipes added here."""
from __future__ import annotations

import json
import re

import pytest
from helpers import HOSTILE

from harness.report.html import write_reports
from harness.report.text import md_code, md_text
from harness.store.runs import load_run

TAG = re.compile(r"<[A-Za-z/!?]")                 # what would start raw HTML in markdown
PIPE = re.compile(r"(?<!\\)\|")


def table_widths(text: str) -> list[set[int]]:
    """Per markdown table: the set of cell-separator counts over its rows (one value if intact)."""
    tables, current = [], set()
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.add(len(PIPE.findall(line)))
        elif current:
            tables.append(current)
            current = set()
    return tables


def test_md_text_escapes_html_pipes_newlines_and_control_characters():
    assert md_text("<b>a|b</b>\x00\nnext\u2028& more") == "&lt;b&gt;a\\|b&lt;/b&gt;\\x00 next &amp; more"
    assert md_text("x" * 10, 5) == "xxxx…"
    assert md_text("<" * 10, 3) == "&lt;&lt;…"          # cut before escaping: no half entity
    assert md_code("export:5386079e") == "`export:5386079e`"
    assert md_code("run:<img src=x>") == "run:&lt;img src=x&gt;"   # never hostile text in a code span


def hostile_store(store):
    """The hostile fixture run, with control characters and pipes in a case name and an error."""
    path = store / "runs" / HOSTILE / "results.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["case"].startswith("<img"):
            rec["case"] = "a|b<i>x</i>\x08"
            rec["error"] = "Bad\x00thing | <b>here</b>\x1b[31m & \x07 there\nsecond line"
            rec["signature"] = "sig|`<x>`"
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return store / "runs" / HOSTILE


def test_hostile_run_renders_escaped_markdown(store):
    run = hostile_store(store)
    meta, records = load_run(run)
    text = write_reports(run, records, meta, store).read_text(encoding="utf-8")
    assert not TAG.search(text), TAG.search(text)
    assert "&lt;img src=x onerror=alert(3)&gt;" in text and "a\\|b&lt;i&gt;x&lt;/i&gt;\\x08" in text
    assert "Bad\\x00thing \\| &lt;b&gt;here&lt;/b&gt;\\x1b[31m &amp; \\x07 there second line" in text
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\u2028]", text)
    widths = table_widths(text)
    assert len(widths) >= 3 and all(len(w) == 1 for w in widths), widths


def test_a_stage_that_is_not_one_is_a_schema_error_naming_the_line(store):
    # Record.stage is an enum: a hostile stage never reaches a report, the read names file and line.
    from harness.core.record import RecordError

    run = hostile_store(store)
    path = run / "results.jsonl"
    lines = path.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["stage"] = "export|<u>"
    path.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    with pytest.raises(RecordError, match=r"results\.jsonl:1: 'stage' must be one of"):
        load_run(run)
