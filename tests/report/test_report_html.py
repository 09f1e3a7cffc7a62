"""HTML reports: self-contained, offline, and every record text escaped (hostile fixture run)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from helpers import BOTH, HOSTILE, make_store

from harness.cli import main
from harness.report.html import render_run_html, script_json, write_site
from harness.store.runs import REPORT_FILES, load_run, write_report_file

CELL_DATA = re.compile(r'<script type="application/json" id="cell-data">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("html"))


def test_script_json_cannot_break_out_of_its_element():
    hostile = {"e": "</script><script>alert(1)</script><!-- \u2028\u2029 & done"}
    text = str(script_json(hostile))
    for bad in ("</", "<!--", "<", ">", "\u2028", "\u2029"):
        assert bad not in text
    assert json.loads(text) == hostile


def test_hostile_texts_render_as_text(store):
    run = store / "runs" / HOSTILE
    meta, records = load_run(run)
    html = render_run_html(run, records, meta)
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>bold" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, in the failures table
    assert 'data-case="&lt;img src=x onerror=alert(2)&gt;"' in html
    # Exactly two script elements: the data and the page script; the data stays one JSON value.
    assert html.count("<script") == 2
    (data,) = CELL_DATA.findall(html)
    cells = json.loads(data)
    crash = next(c for c in cells if c["status"] == "crash")
    assert crash["error"].startswith("RuntimeError: <script>alert(1)</script> then </script><!--")
    assert "Traceback" in crash["log"] and "alert(1)" in crash["log"]


def test_page_is_self_contained(store):
    run = store / "runs" / BOTH
    meta, records = load_run(run)
    html = render_run_html(run, records, meta)
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html), "page must not fetch anything"
    assert "default-src 'none'" in html
    (data,) = CELL_DATA.findall(html)
    cells = json.loads(data)
    passed = next(c for c in cells if c["status"] == "pass" and c["histogram"])
    assert passed["graph"]["ops"] and passed["latency"]["median"] > 0 and passed["parity"]["max_abs"] >= 0
    assert "samples" not in passed["latency"]  # the distribution travels as a histogram
    failed = next(c for c in cells if c["stage"] == "run")
    assert "Traceback" in failed["log"] and "\x1b[" not in failed["log"]
    assert failed["repro"] and failed["versions"]["torch"]


def _fingerprint(run: Path) -> dict[str, tuple[str, int]]:
    return {n: (hashlib.sha256((run / n).read_bytes()).hexdigest(), (run / n).stat().st_mtime_ns)
            for n in ("results.jsonl", "run.json")}


def test_rerender_writes_reports_only(store, capsys):
    run = store / "runs" / BOTH
    before = _fingerprint(run)
    assert main(["--reports", str(store), "report", BOTH, "latest"]) == 0
    assert _fingerprint(run) == before
    for name in ("matrix.md", "matrix.html", "plots/latency.svg", "plots/parity.svg"):
        assert (run / name).exists(), name
    assert (store / "index.html").exists()
    assert "../../index.html" in (run / "matrix.html").read_text()
    for name in ("results.jsonl", "run.json", "logs/x.log"):
        with pytest.raises(ValueError, match="never rewritten"):
            write_report_file(run, name, "")
    assert set(REPORT_FILES) >= {"matrix.md", "matrix.html"}


def test_newer_schema_is_refused_with_upgrade_message(store, tmp_path, capsys):
    import shutil

    run = tmp_path / "future"
    shutil.copytree(store / "runs" / BOTH, run)
    first, *rest = (run / "results.jsonl").read_text().splitlines()
    (run / "results.jsonl").write_text("\n".join([json.dumps({**json.loads(first), "schema": 2}), *rest]) + "\n")
    assert main(["--reports", str(store), "report", str(run)]) == 2
    assert "upgrade" in capsys.readouterr().err


def test_publish_writes_a_static_site(store, tmp_path):
    site = tmp_path / "site"
    index = write_site(store, site)
    assert index == site / "index.html" and (site / ".nojekyll").exists()
    pages = sorted(p.stem for p in (site / "runs").glob("*.html"))
    assert pages == sorted(p.name for p in (store / "runs").iterdir())
    text = index.read_text()
    assert all(f'href="runs/{p}.html"' in text for p in pages) and "data:image/svg+xml;base64," in text
    assert 'href="../index.html"' in (site / "runs" / f"{BOTH}.html").read_text()


def test_publish_writes_nothing_outside_the_site_whatever_the_index_says(store, tmp_path):
    """An index entry is data: a run id holding a path becomes a file name inside runs/."""
    index = json.loads((store / "index.json").read_text())
    index["runs"][0]["run_id"] = "../../escaped"
    (store / "index.json").write_text(json.dumps(index))
    site = tmp_path / "deep" / "site"
    write_site(store, site)
    assert not list(tmp_path.rglob("escaped*.html")) or all(site in p.parents for p in tmp_path.rglob("escaped*.html"))
    assert (site / "runs" / ".._.._escaped.html").exists()
