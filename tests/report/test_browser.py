"""The HTML report in a real headless browser (Debian's chromium driven by Playwright).

CI installs chromium (.ci/run); the test skips only where /usr/bin/chromium is absent.
Screenshots land in the test's tmp dir (the path is printed) for a look at the rendered page.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import BOTH, HOSTILE, make_store
from playwright.sync_api import Page, sync_playwright

from harness.report.html import write_reports
from harness.store.runs import load_run

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    reports = make_store(tmp_path_factory.mktemp("browser"))
    for run_id in (BOTH, HOSTILE):
        meta, records = load_run(reports / "runs" / run_id)
        write_reports(reports / "runs" / run_id, records, meta, reports)
    return reports


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


class Watched:
    """A page that records console errors, script errors, dialogs and any non-local request."""

    def __init__(self, browser, url: str):
        self.problems: list[str] = []
        self.dialogs: list[str] = []
        self.page: Page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", self._dialog)
        self.page.on("request", lambda r: r.url.startswith(("file:", "data:")) or self.problems.append(
            f"network request: {r.url}"))
        self.page.goto(url)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def visible_rows(self) -> int:
        return self.page.locator("#matrix tbody tr:visible").count()


def test_matrix_filters_sorts_and_opens_details(browser, store, tmp_path):
    w = Watched(browser, (store / "runs" / BOTH / "matrix.html").as_uri())
    page = w.page
    assert w.visible_rows() == 12
    page.screenshot(path=str(tmp_path / "matrix.png"), full_page=True)

    page.select_option("select[data-axis=exporter]", "dynamo")
    assert w.visible_rows() == 6
    page.select_option("select[data-axis=status]", "fail")
    assert w.visible_rows() == 2  # conv_bn/dynamo op13 and op17 fail on torch 2.6.0
    page.select_option("select[data-axis=torch]", "2.13.0")
    assert w.visible_rows() == 0 and page.locator("th[data-torch='2.6.0']").is_hidden()
    page.click("button[type=reset]")
    page.fill("input[name=q]", "SecondShapeError")
    assert w.visible_rows() == 2 and "2 of 12 rows" in page.inner_text("#shown")
    page.fill("input[name=q]", "")

    page.click("th[data-sort=opset]")
    page.click("th[data-sort=opset]")  # second click: descending
    assert page.locator("#matrix tbody tr").first.get_attribute("data-opset") == "18"

    page.click("#matrix td.s-fail[data-status=fail] >> nth=0")
    dialog = page.locator("dialog#details")
    assert dialog.is_visible()
    body = dialog.inner_text().lower()  # section headings are upper-cased by CSS
    assert "traceback" in body and "reproduce" in body and "versions" in body
    page.screenshot(path=str(tmp_path / "details-fail.png"))
    page.keyboard.press("Escape")
    assert not dialog.is_visible()

    page.click("#matrix td.s-pass >> nth=0")
    assert page.locator("dialog#details svg.hist rect").count() == 24  # latency distribution
    assert page.locator("dialog#details .bar").count() > 0  # op histogram
    assert "max_abs" in dialog.inner_text()
    page.screenshot(path=str(tmp_path / "details-pass.png"))
    print(f"screenshots: {tmp_path}")
    assert (tmp_path / "matrix.png").stat().st_size > 10_000
    assert w.problems == [] and w.dialogs == []


def test_hostile_text_is_shown_as_text(browser, store, tmp_path):
    w = Watched(browser, (store / "runs" / HOSTILE / "matrix.html").as_uri())
    page = w.page
    assert "<script>alert(1)</script>" in page.inner_text("table.list")
    assert page.locator("#matrix tbody tr[data-case='<img src=x onerror=alert(2)>']").count() == 1
    assert page.locator("main img:not(.plot img)").count() == 0  # no element came from record text
    page.screenshot(path=str(tmp_path / "hostile.png"), full_page=True)
    page.click("#matrix td.s-crash")
    err = page.inner_text("dialog#details pre.err")
    assert err.startswith("RuntimeError: <script>alert(1)</script> then </script><!--")
    assert "alert(1)" in page.inner_text("dialog#details pre.log")
    page.wait_for_timeout(300)  # give an injected handler (onerror, timers) the chance to fire
    page.screenshot(path=str(tmp_path / "hostile-details.png"))
    assert w.dialogs == [], f"a script from record text ran: {w.dialogs}"
    assert w.problems == []


def test_index_page_links_every_run(browser, store):
    w = Watched(browser, (store / "index.html").as_uri())
    links = w.page.locator("table.runs a")
    assert links.count() == 3
    links.first.click()
    assert w.page.url.endswith(f"{HOSTILE}/matrix.html")
    assert w.problems == [] and w.dialogs == []


def test_details_show_drift_fixed_dims_reduction_and_bundle_links(browser, tmp_path):
    """A run whose records carry the newer graph facts: the cell details show them (the extra
    details script is embedded only in such runs), also when the cell is opened from the URL."""
    from harness.core.cell import CellKey, ExportOptions
    from harness.core.record import Record, append_record
    from harness.core.run import RunMeta
    from harness.core.status import Status

    run_dir = tmp_path / "run"
    bundle = run_dir / "bundles" / "torch2.13.0-m-dynamo-op18-dim-named-ort-cpu"
    bundle.mkdir(parents=True)
    for name in ("model.onnx", "reduced.onnx", "inputs.npz"):
        (bundle / name).write_bytes(b"x" * 10)
    RunMeta(run_id="r1", started=1.0, finished=True).write(run_dir)
    io = lambda dims: {"inputs": [{"name": "input_0", "dtype": "float", "shape": dims}],
                       "outputs": [{"name": "output_0", "dtype": "float", "shape": [dims[0], 1]}]}
    key = CellKey("m", "dynamo", 18, "ort-cpu", ExportOptions(dim_policy="named"))
    note = "seq was fixed to 6 by the exporter (input_0 dim 1)"
    old = Record.for_cell("r1", key, "2.6.0", "e", Status.PASS,
                          graph={"nodes": 2, "ops": {"Relu": 2}, "bytes": 900, "opset": 18, "io": io(["b", "s", 8])})
    new = Record.for_cell("r1", key, "2.13.0", "e", Status.FAIL, stage="run", error="Fail: boom", notes=[note],
                          bundle=str(bundle),
                          graph={"nodes": 3, "ops": {"Relu": 2, "Reshape": 1}, "bytes": 1900, "opset": 18,
                                 "io": io(["b", 6, 8]),
                                 "specialised": [{"dim": "seq", "input": "input_0", "axis": 1, "value": 6, "note": note}],
                                 "reduced": {"original_nodes": 3, "nodes": 1, "ops": {"Reshape": 1},
                                             "file": str(bundle / "reduced.onnx"), "check": "fails at run: Fail: boom"}})
    for rec in (old, new):
        append_record(run_dir / "results.jsonl", rec)
    write_reports(run_dir, [old, new], RunMeta(run_id="r1", started=1.0, finished=True), None)
    w = Watched(browser, (run_dir / "matrix.html").as_uri())
    page = w.page
    assert "input_0 dims [b, s, 8] → [b, 6, 8]" in page.inner_text("#graph-changes")
    assert note in page.inner_text("#fixed-dims") and "3 → 1" in page.inner_text("#reduced")
    page.click("#matrix td.s-fail")
    body = page.inner_text("dialog#details .d-extra")
    assert note in body and "ops +Reshape×1" in body and "input_0 dims [b, s, 8] → [b, 6, 8]" in body
    assert "3 → 1 nodes" in body and "fails at run" in body
    links = page.locator("dialog#details .d-extra a")
    assert sorted(links.all_inner_texts()) == ["inputs.npz", "model.onnx", "reduced.onnx"]
    assert links.first.get_attribute("href").startswith("bundles/torch2.13.0-m-dynamo-op18-dim-named-ort-cpu/")
    page.screenshot(path=str(tmp_path / "details-diagnosis.png"))
    again = Watched(browser, (run_dir / "matrix.html").as_uri() + "#cell=torch2.13.0-m-dynamo-op18-dim-named-ort-cpu")
    assert again.page.locator("dialog#details .d-extra").count() == 1
    assert w.problems == [] and again.problems == [] and w.dialogs == []


def test_blame_filter_and_ladder_in_details(browser, tmp_path):
    """A run whose failing cells carry a blame: the blame filter keeps the rows with that party's
    cells, and a cell's details show the party, the repository and the ladder's rungs."""
    from harness.core.cell import CellKey
    from harness.core.record import Blame, Record, append_record
    from harness.core.run import RunMeta
    from harness.core.status import Status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunMeta(run_id="r1", started=1.0, finished=True).write(run_dir)
    kernel = Record.for_cell("r1", CellKey("lstm", "torchscript", 17, "openvino"), "2.13.0", "e", Status.FAIL,
                             stage="parity", error="ParityError: example shape: output 0: 48/180 elements beyond",
                             blame=Blame("runtime-kernel", "openvino fails where ONNX Runtime agrees with eager",
                                         "openvinotoolkit/openvino",
                                         [{"rung": "onnx-reference", "outcome": "no-reference", "detail": "sequence_lens"},
                                          {"rung": "ort-disable-all", "outcome": "agrees", "detail": ""}]))
    model = Record.for_cell("r1", CellKey("flat", "dynamo", 17, "ort-cpu"), "2.13.0", "e", Status.FAIL,
                            stage="run", error="SecondShapeError: at second shape",
                            blame=Blame("model-code", "seq was fixed", None, [], source="m.py:20: n = int(x.shape[1])"))
    ok = Record.for_cell("r1", CellKey("conv", "dynamo", 17, "ort-cpu"), "2.13.0", "e", Status.PASS)
    for rec in (kernel, model, ok):
        append_record(run_dir / "results.jsonl", rec)
    write_reports(run_dir, [kernel, model, ok], RunMeta(run_id="r1", started=1.0, finished=True), None)
    w = Watched(browser, (run_dir / "matrix.html").as_uri())
    page = w.page
    assert "openvinotoolkit/openvino" in page.inner_text("#blame-section")
    assert w.visible_rows() == 3
    page.select_option("select[data-party-filter]", "runtime-kernel")
    assert w.visible_rows() == 1 and page.locator("#matrix tbody tr:visible td").first.inner_text() == "lstm"
    page.select_option("select[data-party-filter]", "")
    assert w.visible_rows() == 3
    page.click("#matrix td[data-party='runtime-kernel']")
    body = page.inner_text("dialog#details .d-blame")
    assert "runtime-kernel · report to openvinotoolkit/openvino" in body
    assert "onnx-reference" in body and "no-reference" in body and "ort-disable-all" in body
    assert w.problems == [] and w.dialogs == []


def test_pipeline_filter_over_the_matrix_and_the_steps(browser, tmp_path):
    """A run with post-export pipelines: the pipeline filter keeps that pipeline's matrix rows and
    step rows; a run without pipelines has no such filter (tests above)."""
    from harness.core.cell import CellKey, ExportOptions
    from harness.core.record import Record, append_record
    from harness.core.run import RunMeta
    from harness.core.status import Status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = RunMeta(run_id="r1", started=1.0, finished=True)
    meta.write(run_dir)
    steps = {"name": "fused", "steps": [{"step": "ort-fusion", "status": "pass", "fused": {"Attention": 2},
                                         "before": {"nodes": 220}, "after": {"nodes": 24, "bytes": 1}, "seconds": 2.0}]}
    recs = [Record.for_cell("r1", CellKey("enc", "torchscript", 18, "ort-cpu"), "2.13.0", "e", Status.PASS),
            Record.for_cell("r1", CellKey("enc", "torchscript", 18, "ort-cpu", ExportOptions(pipeline="fused")),
                            "2.13.0", "e", Status.PASS, graph={"pipeline": steps})]
    for rec in recs:
        append_record(run_dir / "results.jsonl", rec)
    write_reports(run_dir, recs, meta, None)
    w = Watched(browser, (run_dir / "matrix.html").as_uri())
    page = w.page
    assert "Attention 2" in page.inner_text("#pipelines")
    assert w.visible_rows() == 2
    page.select_option("select[data-pipeline-filter]", "raw")
    assert w.visible_rows() == 1 and not page.locator("#pipeline-steps tbody tr").first.is_visible()
    page.select_option("select[data-pipeline-filter]", "fused")
    assert w.visible_rows() == 1 and page.locator("#pipeline-steps tbody tr").first.is_visible()
    assert "pipe-fused" in page.locator("#matrix tbody tr:visible").first.inner_text()
    assert w.problems == [] and w.dialogs == []
