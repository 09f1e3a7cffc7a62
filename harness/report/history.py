"""What changed when, across the nights of the history (``harness.store.nights``), and its site.

- ``cell_histories``: per cell (torch plus ``CellKey``), its status on every night (the trend
  strip), the night its current state began and how long it has lasted, the night it first failed
  (start of its latest failing streak) and the night it was fixed (end of that streak);
- ``changes``: cells whose status differs between two nights, each with the torch, companion and
  runtime versions of its environment that changed between them (and the case files, if any);
- ``freshness``: when the newest night ran, whether it is older than a set age, and which nightly
  failed or is missing;
- ``write_history_site``: ``index.html`` (freshness, changes since last night and since last week,
  every cell with its trend strip and history, every night) and ``nights/<night>.html`` (that
  night's full report, with its overview). A night's page is written again only when its night,
  the night before or the report's code changed (a stamp in its first line), so a site kept
  between publishes (the workflow caches it) renders only the new night.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.core.cell import CellKey
from harness.core.record import Record, count_by_status, layer_change
from harness.core.status import Status
from harness.core.text import ENCODE_ERRORS
from harness.store.nights import Night, NightScan, scan_nights

# One character per night in a trend strip; "-": the cell was not in that night's run.
CODES = {Status.PASS: "p", Status.FAIL: "f", Status.CRASH: "c", Status.TIMEOUT: "t",
         Status.XFAIL: "x", Status.XPASS: "X", Status.SKIP: "s", Status.ERROR: "e"}
ABSENT = "-"
DEFAULT_MAX_AGE_H = 36.0
WEEK = dt.timedelta(days=7)


def cell_of(rec: Record) -> tuple[str, CellKey]:
    return rec.torch, rec.key


@dataclass
class Streak:
    """Consecutive nights a cell had one status (absent nights do not break a streak)."""

    status: str
    first: str            # night name
    last: str
    nights: int
    stage: str | None = None
    error: str | None = None
    changed: list[str] = field(default_factory=list)   # versions that changed as it began


@dataclass
class CellHistory:
    cell_id: str
    torch: str
    key: CellKey
    strip: str                      # one CODES character per night, oldest first
    streaks: list[Streak]
    reason: str | None = None       # the newest skip's reason (skips are folded by it)

    @property
    def status(self) -> str:
        return self.streaks[-1].status

    @property
    def since(self) -> str:
        return self.streaks[-1].first

    @property
    def first_failed(self) -> str | None:
        """The night the latest failing streak began (None: never failed in the history)."""
        failing = [s for s in self.streaks if Status(s.status).is_failure]
        return failing[-1].first if failing else None

    @property
    def fixed(self) -> str | None:
        """The night after the latest failing streak when it passed again (None: not fixed)."""
        fixed = None
        for before, after in zip(self.streaks, self.streaks[1:]):
            if Status(before.status).is_failure and Status(after.status).passed:
                fixed = after.first
            elif Status(after.status).is_failure:
                fixed = None
        return fixed

    def days_in_state(self, newest: dt.date) -> int:
        return (newest - _date(self.since)).days


def _date(night: str) -> dt.date:
    return dt.date.fromisoformat(night.split(".")[0])


def _short_error(error: str | None, n: int = 200) -> str | None:
    if not error:
        return None
    error = error.split(" <- ")[-1]
    return error if len(error) <= n else error[: n - 1] + "…"


def version_changes(old: Night, new: Night, old_rec: Record, new_rec: Record) -> list[str]:
    """'onnxruntime 1.31.0 → 1.32.0': packages of the cell's environment that changed, added or
    went between two nights; 'case files changed: x.py' when what the case loaded did."""
    before = old.environments.get(old_rec.env) or old_rec.versions or {}
    after = new.environments.get(new_rec.env) or new_rec.versions or {}
    out = [f"{name} {before.get(name, '–')} → {after.get(name, '–')}"
           for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)
           and isinstance(before.get(name, ""), str) and isinstance(after.get(name, ""), str)]
    files = sorted(n for n in set(old_rec.case_files) | set(new_rec.case_files)
                   if old_rec.case_files.get(n) != new_rec.case_files.get(n))
    if files:
        out.append("case files changed: " + ", ".join(files))
    return out


@dataclass
class History:
    nights: list[Night]
    records: list[dict[tuple[str, CellKey], Record]]     # per night, by cell
    cells: list[CellHistory]

    @property
    def newest(self) -> Night | None:
        return self.nights[-1] if self.nights else None


def build_history(nights: list[Night]) -> History:
    per_night = [{cell_of(r): r for r in n.to_records()} for n in nights]
    keys = sorted({k for recs in per_night for k in recs}, key=lambda k: (k[1].as_tuple(), k[0]))
    cells = []
    for key in keys:
        strip, streaks, prev_i = [], [], None
        for i, recs in enumerate(per_night):
            rec = recs.get(key)
            strip.append(CODES[rec.status] if rec else ABSENT)
            if rec is None:
                continue
            if streaks and streaks[-1].status == rec.status.value:
                streaks[-1].last, streaks[-1].nights = nights[i].night, streaks[-1].nights + 1
            else:
                changed = (version_changes(nights[prev_i], nights[i], per_night[prev_i][key], rec)
                           if prev_i is not None else [])
                streaks.append(Streak(rec.status.value, nights[i].night, nights[i].night, 1,
                                      rec.stage, _short_error(rec.error), changed))
            prev_i = i
        last = next(recs[key] for recs in reversed(per_night) if key in recs)
        cells.append(CellHistory(last.cell_id, key[0], key[1], "".join(strip), streaks,
                                 last.reason if last.status is Status.SKIP else None))
    return History(nights, per_night, cells)


@dataclass
class Change:
    cell_id: str
    torch: str
    key: CellKey
    before: str
    after: str
    stage: str | None
    error: str | None
    versions: list[str]
    layer: str | None = None    # the blamed layer moved (both nights failing): 'blamed layer moved: A → B'


def changes(history: History, old_i: int, new_i: int) -> list[Change]:
    """Cells in both nights whose status differs, failures first."""
    old, new = history.records[old_i], history.records[new_i]
    out = []
    for key, rec in new.items():
        prev = old.get(key)
        moved = layer_change(prev, rec) if prev is not None else None
        if prev is None or prev.status == rec.status and moved is None:
            continue
        out.append(Change(rec.cell_id, key[0], key[1], prev.status.value, rec.status.value, rec.stage,
                          _short_error(rec.error),
                          version_changes(history.nights[old_i], history.nights[new_i], prev, rec), moved))
    return sorted(out, key=lambda c: (not Status(c.after).is_failure, c.key.as_tuple(), c.torch))


def week_before(history: History) -> int | None:
    """The index of the newest night at least 7 days before the newest one, else the oldest
    (among the nights that have a run)."""
    ran = [i for i, n in enumerate(history.nights) if n.records]
    if len(ran) < 2:
        return None
    newest = history.nights[ran[-1]].date
    older = [i for i in ran[:-1] if history.nights[i].date <= newest - WEEK]
    return older[-1] if older else ran[0]


@dataclass
class Freshness:
    newest: str | None
    newest_started: float | None
    age_h: float | None
    max_age_h: float
    failed: list[dict[str, Any]]      # nights whose nightly did not succeed
    missing: list[str]                # dates between the first and the newest night without one
    newest_ran: str | None = None     # the newest night with a run (its data's age is the age)
    # Cells of the newest run the matrix's own code failed on (status error): a bug of the
    # project, so the check fails on it, while the night itself is kept and published.
    own_errors: int = 0

    @property
    def stale(self) -> bool:
        return self.age_h is None or self.age_h > self.max_age_h

    @property
    def newest_failed(self) -> bool:
        return bool(self.failed) and self.failed[-1]["night"] == self.newest

    @property
    def ok(self) -> bool:
        return not self.stale and not self.newest_failed and not self.own_errors

    def line(self) -> str:
        if self.newest is None:
            return "no night recorded yet"
        if self.newest_ran is None:
            text = "no night with a run yet"
        else:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.newest_started or 0))
            text = f"newest night {self.newest_ran} (run started {when}, {self.age_h:.1f} h ago)"
            if self.stale:
                text += f": older than {self.max_age_h:g} h"
        if self.newest_failed:
            own = self.newest == self.newest_ran
            text += f"; {'its' if own else 'the ' + self.newest} nightly ended: {self.failed[-1]['outcome']}"
        if self.own_errors:
            text += (f"; {self.own_errors} of its cells have no verdict: the matrix's own code failed on "
                     "them (status error)")
        return text


def freshness(nights: list[Night], max_age_h: float = DEFAULT_MAX_AGE_H, now: float | None = None) -> Freshness:
    now = time.time() if now is None else now
    failed = [{"night": n.night, "outcome": n.outcome, "url": n.url} for n in nights
              if n.outcome not in ("success", "unknown")]
    missing: list[str] = []
    if nights:
        have = {n.date for n in nights}
        day = nights[0].date
        while day < nights[-1].date:
            if day not in have:
                missing.append(day.isoformat())
            day += dt.timedelta(days=1)
    ran = [n for n in nights if n.records]
    data = ran[-1] if ran else None
    own = sum(1 for r in data.to_records() if r.status.is_own_error) if data else 0
    return Freshness(nights[-1].night if nights else None, data.started if data else None,
                     (now - data.started) / 3600 if data else None, max_age_h, failed, missing,
                     data.night if data else None, own)


# ---------------------------------------------------------------------------------------------
# The site


def _key_dict(torch: str, key: CellKey) -> dict[str, Any]:
    return {"torch": torch, "case": key.case, "exporter": key.exporter, "opset": key.opset,
            "runtime": key.runtime, "options": key.options.label}


def _change_dict(c: Change) -> dict[str, Any]:
    return {"cell_id": c.cell_id, **_key_dict(c.torch, c.key), "before": c.before, "after": c.after,
            "stage": c.stage, "error": c.error, "versions": c.versions, **({"layer": c.layer} if c.layer else {})}


def page_data(history: History, fresh: Freshness) -> dict[str, Any]:
    """Everything the history page's script draws: nights, cells with strips and streaks."""
    newest = history.newest.date if history.newest else dt.date.today()
    from harness.report.html import safe_href

    nights = [{"night": n.night, "started": n.started, "outcome": n.outcome, "url": safe_href(n.url),
               "counts": {k: v for k, v in count_by_status(n.to_records()).items() if v},
               "href": f"nights/{n.night}.html"} for n in history.nights]
    cells = [{"id": c.cell_id, **_key_dict(c.torch, c.key), "strip": c.strip, "status": c.status,
              "since": c.since, "days": c.days_in_state(newest), "nights": c.streaks[-1].nights,
              "first_failed": c.first_failed, "fixed": c.fixed, "reason": c.reason,
              "streaks": [asdict(s) for s in c.streaks]}
             for c in history.cells]
    return {"nights": nights, "cells": cells, "newest_started": fresh.newest_started,
            "max_age_h": fresh.max_age_h}


def skipped_lines(history: History) -> list[dict[str, Any]]:
    """Cells skipped on every night they ran, one line per runtime and reason."""
    groups: dict[tuple[str, str], int] = {}
    for c in history.cells:
        if set(c.strip) <= {CODES[Status.SKIP], ABSENT}:
            k = (c.key.runtime, c.reason or "no reason recorded")
            groups[k] = groups.get(k, 0) + 1
    return [{"runtime": r, "reason": why, "cells": n} for (r, why), n in sorted(groups.items())]


STAMP = "night-page"


def _renderer_digest() -> str:
    """What a night's page depends on besides its nights: the report's code and templates."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted([*here.glob("*.py"), *(here / "templates").iterdir()]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _page_stamp(renderer: str, night: Path, previous: Path | None) -> str:
    digest = hashlib.sha256(renderer.encode())
    for path in (night, previous):
        digest.update(path.read_bytes() if path else b"")
    return digest.hexdigest()[:24]


def _stamp_of(page: Path) -> str | None:
    try:
        with page.open(encoding="utf-8") as fh:
            first = fh.readline()
    except OSError:
        return None
    parts = first.split()
    return parts[2] if len(parts) >= 4 and parts[1] == STAMP else None


def write_history_site(nights_dir: Path, site: Path, max_age_h: float = DEFAULT_MAX_AGE_H,
                       now: float | None = None, scan: NightScan | None = None) -> Path:
    """The published site: index.html (the history) and one page per night; returns index.html.
    ``scan``: the nights already read (a damaged night file is left out, named on stderr)."""
    import sys

    from harness.report.aggregate import records_frame
    from harness.report.html import _asset, _when, render_page, render_run_html, script_json

    if scan is None:
        scan = scan_nights(nights_dir, warn=lambda line: print(line, file=sys.stderr))
    nights = scan.nights
    history = build_history(nights)
    fresh = freshness(nights, max_age_h, now)
    (site / "nights").mkdir(parents=True, exist_ok=True)
    (site / ".nojekyll").write_text("")
    files = [n.source for n in nights]
    renderer = _renderer_digest()
    for i, night in enumerate(nights):
        if not night.records:
            continue   # a nightly that produced no run: listed, no page
        page = site / "nights" / f"{night.night}.html"
        before = [f for f, n in zip(files[:i], nights[:i]) if n.records]
        stamp = _page_stamp(renderer, files[i], before[-1] if before else None)
        if _stamp_of(page) == stamp:
            continue   # the same night, previous night and renderer: the page as it is
        records = night.to_records()
        previous = None
        earlier = [n for n in nights[:i] if n.records]
        if earlier:
            prev = earlier[-1]
            previous = (prev.meta(), records_frame(prev.to_records()))
        # No plots on night pages: rendering them costs more than the rest of the page.
        html = render_run_html(site / "nights", records, night.meta(), previous, {}, "../index.html",
                               "every night")
        page.write_text(f"<!-- {STAMP} {stamp} -->\n" + html, encoding="utf-8", errors=ENCODE_ERRORS)
    ran = [i for i, n in enumerate(nights) if n.records]     # nights with a run to compare
    last = [_change_dict(c) for c in changes(history, ran[-2], ran[-1])] if len(ran) > 1 else None
    week_i = week_before(history)
    week = [_change_dict(c) for c in changes(history, week_i, ran[-1])] if week_i is not None else None
    html = render_page(
        "history.html.j2", fresh=fresh, nights=list(reversed(nights)), updated=_when(time.time() if now is None else now),
        when=_when, since_last=last, since_week=week,
        previous=nights[ran[-2]].night if len(ran) > 1 else None, newest_ran=nights[ran[-1]].night if ran else None,
        week_night=nights[week_i].night if week_i is not None else None,
        skipped=skipped_lines(history), counts=[count_by_status(n.to_records()) for n in reversed(nights)],
        ran_index=len(nights) - 1 - ran[-1] if ran else None,
        data=script_json(page_data(history, fresh)), css=_asset("report.css") + _asset("history.css"),
        js=_asset("history.js"))
    index = site / "index.html"
    index.write_text(html, encoding="utf-8", errors=ENCODE_ERRORS)
    return index
