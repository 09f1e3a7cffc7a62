"""The history site in Chromium: 30 nights made from the real fixture runs through the append path
(re-dated one per night; the hostile fixture, with its crashed cell and a case named like an
<img onerror> tag, on nights 12 to 14), published, then loaded, filtered, a cell's history opened
and a night's report followed. Setup (chromium, Playwright, the watched page) is test_browser's."""
from __future__ import annotations

import datetime as dt

import pytest
from helpers import BOTH, FIXTURES, HOSTILE
from playwright.sync_api import sync_playwright
from test_browser import ARGS, CHROMIUM, Watched

from harness.report.history import write_history_site
from harness.store.nights import read_nights
from harness.store.nights_append import append_night

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} not installed (apt-get install chromium)")
NIGHTS = [(dt.date(2026, 11, 1) + dt.timedelta(days=i)).isoformat() for i in range(30)]
HOSTILE_NIGHTS = set(NIGHTS[11:14])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("history")
    for night in NIGHTS:
        run = HOSTILE if night in HOSTILE_NIGHTS else BOTH
        append_night(FIXTURES / "runs" / run, root / "nights", night, outcome="success")
    assert [n.night for n in read_nights(root / "nights")] == NIGHTS
    write_history_site(root / "nights", root / "site")
    return root / "site"


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def test_thirty_nights_load_filter_and_open_a_cells_history(browser, site, tmp_path):
    w = Watched(browser, (site / "index.html").as_uri())
    page = w.page
    rows = "#cells tbody tr:visible"
    # 24 cells of the two-torch run and the hostile run's extra cell; none is skipped only.
    assert page.locator(rows).count() == 25
    assert "25 of 25 cells" in page.inner_text("#hshown")
    # The fixture runs started on 2026-11-29: the newest night is stale, the banner says so.
    assert page.locator("#stale-banner").is_visible() and "h ago" in page.inner_text("#stale-banner")
    assert page.locator("#nights tbody tr").count() == 30
    page.screenshot(path=str(tmp_path / "history.png"), full_page=True)

    page.select_option("#hfilters select[data-axis=torch]", "2.6.0")
    assert page.locator(rows).count() == 12
    page.select_option("#hfilters select[name=state]", "failing")
    assert page.locator(rows).count() == 5        # conv_bn dynamo op13/17, mha torchscript op13/17/18
    page.click("#hfilters button[type=reset]")
    page.select_option("#hfilters select[name=state]", "changed")
    # Cells whose status changed across the nights: the crashed cell (pass → crash → pass)
    # and the hostile run's own cell (absent on the other nights, one streak: not changed).
    changed = page.locator(rows)
    assert changed.count() == 1
    changed.first.click()
    history = page.locator("#cell-history tbody tr")
    assert page.locator("#cell").is_visible() and history.count() == 3
    assert page.inner_text("#cell-name") == "torch2.13.0-mha-dynamo-op18-ort-cpu"
    texts = [history.nth(i).inner_text() for i in range(3)]   # newest streak first
    assert NIGHTS[14] in texts[0] and "pass" in texts[0]
    assert NIGHTS[11] in texts[1] and NIGHTS[13] in texts[1] and "crash" in texts[1]
    assert NIGHTS[0] in texts[2] and "pass" in texts[2]
    page.fill("#hfilters input[name=q]", "onerror")
    page.select_option("#hfilters select[name=state]", "")
    assert page.locator(rows).count() == 1        # the hostile case, shown as text
    assert w.problems == [] and w.dialogs == [], (w.problems, w.dialogs)

    # A streak's night opens that night's report, overview first.
    page.click(f"#cell-history a[href='nights/{NIGHTS[11]}.html']")
    page.wait_for_load_state()
    assert page.url.endswith(f"nights/{NIGHTS[11]}.html")
    assert page.locator("#overview-section").is_visible() and page.locator("#matrix tbody tr:visible").count() == 13
    # The overview's count opens its rows: conv_bn on ort-cpu, torch 2.13.0, both exporters × 3 opsets.
    grid = page.locator("td[data-ov-case=conv_bn][data-ov-runtime=ort-cpu]")
    assert grid.count() == 1 and grid.inner_text() == "6/6"
    grid.click()
    assert page.locator("#matrix tbody tr:visible").count() == 6
    assert w.problems == [] and w.dialogs == [], (w.problems, w.dialogs)
