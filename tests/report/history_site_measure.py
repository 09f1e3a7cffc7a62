"""Measure the history site of 30 nights made from real runs of the default matrix (not a test:
its numbers are in docs/history.md).

    python tests/report/history_site_measure.py --work /tmp/h30 \
        --nights-from A:8 B:6 C:3 B:7 D:6

Each ``RUN:COUNT`` appends run directory RUN (a real, finished run) as the next COUNT nights,
re-dated one per day through ``harness.store.nights_append.append_night`` (the path `history append`
takes), ending today. Then the site is published twice (cold, then with the night pages kept) and
opened in Chromium: the load time of index.html until its cells are drawn, a filter, a cell's
history opened, a night's report loaded. Sizes of the night files and the pages are printed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from harness.report.history import write_history_site
from harness.store.nights import night_files
from harness.store.nights_append import append_night

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--nights-from", nargs="+", required=True, metavar="RUN:COUNT")
    args = p.parse_args()
    plan = [(Path(s.rsplit(":", 1)[0]), int(s.rsplit(":", 1)[1])) for s in args.nights_from]
    total = sum(n for _, n in plan)
    shutil.rmtree(args.work, ignore_errors=True)
    nights, site = args.work / "nights", args.work / "site"
    today = dt.datetime.now(dt.timezone.utc).date()
    day = today - dt.timedelta(days=total - 1)
    for run, count in plan:
        for _ in range(count):
            append_night(run, nights, day.isoformat(), outcome="success")
            day += dt.timedelta(days=1)
    files = night_files(nights)
    sizes = [f.stat().st_size for f in files]
    t0 = time.perf_counter()
    write_history_site(nights, site)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_history_site(nights, site)
    warm = time.perf_counter() - t0
    pages = sorted((site / "nights").glob("*.html"))
    out = {"nights": len(files), "night_file_kib": {"min": min(sizes) / 1024, "max": max(sizes) / 1024,
                                                    "mean": sum(sizes) / len(sizes) / 1024},
           "nights_total_kib": sum(sizes) / 1024,
           "index_kib": (site / "index.html").stat().st_size / 1024,
           "night_page_kib_mean": sum(q.stat().st_size for q in pages) / len(pages) / 1024,
           "publish_s": {"cold": cold, "warm (pages kept)": warm}}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        t0 = time.perf_counter()
        page.goto((site / "index.html").as_uri())
        page.wait_for_selector("#cells tbody tr")
        out["index_load_ms"] = (time.perf_counter() - t0) * 1000
        out["index_nav_timing_ms"] = page.evaluate(
            "() => { const t = performance.getEntriesByType('navigation')[0]; return {dom: t.domContentLoadedEventEnd, load: t.loadEventEnd}; }")
        out["cells"] = page.locator("#cells tbody tr").count()
        out["cells_shown"] = page.locator("#cells tbody tr:visible").count()
        t0 = time.perf_counter()
        page.select_option("#hfilters select[name=state]", "changed")
        out["filter_ms"] = (time.perf_counter() - t0) * 1000
        out["changed_cells"] = page.locator("#cells tbody tr:visible").count()
        t0 = time.perf_counter()
        page.locator("#cells tbody tr:visible").first.click()
        page.wait_for_selector("#cell:not([hidden])")
        out["open_history_ms"] = (time.perf_counter() - t0) * 1000
        out["opened"] = {"cell": page.inner_text("#cell-name"),
                         "streaks": [page.locator("#cell-history tbody tr").nth(i).inner_text().replace("\t", " | ")
                                     for i in range(page.locator("#cell-history tbody tr").count())]}
        page.screenshot(path=str(args.work / "history.png"), full_page=False)
        t0 = time.perf_counter()
        page.goto((site / "nights" / f"{files[-1].name.split('.json')[0]}.html").as_uri())
        page.wait_for_selector("#matrix tbody tr")
        out["night_page_load_ms"] = (time.perf_counter() - t0) * 1000
        out["night_rows_shown"] = page.locator("#matrix tbody tr:visible").count()
        out["night_rows"] = page.locator("#matrix tbody tr").count()
        page.screenshot(path=str(args.work / "night.png"), full_page=False)
        out["page_errors"] = errors
        b.close()
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
