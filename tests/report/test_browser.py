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
