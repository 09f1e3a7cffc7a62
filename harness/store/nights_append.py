"""Adding to the nightly history: a finished run of the nightly's matrix becomes a night file
(``append_night``), a nightly that produced no run an empty one (``append_failed_night``).

A night keeps what the reports and the gate read of a run, not its logs, bundles or latency
samples (those stay workflow artifacts with their retention, linked by ``url``): every record
without its log, bundle, timing samples and per-shape details, and per environment its installed
packages. Written gzip-compressed with a fixed header (no name or time in it), keys sorted, whole
or not at all, and validated as it will be read (``harness.store.nights``): no date or time in
the future, an http(s) ``url``, the name of its file.
"""
from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from harness.core.record import Record
from harness.core.run import RunMeta
from harness.matrix.rules import ConfigError
from harness.store.nights import (
    CLOCK_SKEW_S,
    OUTCOMES,
    SUFFIX,
    Night,
    night_path,
    nights_folder,
    scan_nights,
    valid_night,
)

# Record fields a night leaves out: where the run's files were, and per-sample detail.
DROPPED = ("log", "bundle", "repro", "graph", "duration_s", "notes", "cache_key", "finished_at")
ERROR_CHARS = 600

def compact_record(rec: Record) -> dict[str, Any]:
    """A record as a night keeps it: identity, verdict, parity and latency summaries, versions."""
    out = rec.to_dict()
    for name in DROPPED:
        out.pop(name, None)
    if isinstance(out.get("error"), str) and len(out["error"]) > ERROR_CHARS:
        out["error"] = out["error"][:ERROR_CHARS] + "…"
    out["latency_ms"] = rec.latency_ms.to_dict(samples=False)
    out["parity"] = {k: v for k, v in rec.parity.to_dict().items() if k != "shapes"}
    if rec.blame is not None:
        out["blame"] = {k: v for k, v in rec.blame.to_dict().items() if k in ("party", "reason", "repository", "layer", "kind")}
    return {k: v for k, v in out.items() if v not in (None, {}, [])}


def installed_versions(meta: RunMeta) -> dict[str, dict[str, str]]:
    """Per environment: the packages it had installed (``name → version``), from run.json."""
    out: dict[str, dict[str, str]] = {}
    for name, marker in sorted(meta.environments.items()):
        if not isinstance(marker, dict):
            continue
        pins = marker.get("installed") or marker.get("packages") or []
        out[name] = dict(sorted(p.split("==", 1) for p in pins if isinstance(p, str) and "==" in p))
    return out


def _dumps(night: Night) -> bytes:
    buf = io.BytesIO()
    # mtime=0 and no file name: the same night gives the same bytes (git stores it once).
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="", compresslevel=9) as gz:
        gz.write(json.dumps(night.to_dict(), sort_keys=True, separators=(",", ":"), default=str).encode())
    return buf.getvalue()


def check_url(url: str | None) -> str | None:
    """``--url``: a nightly's page is an http(s) link (it becomes a link on the site)."""
    if url is not None and not re.match(r"^https?://[^\s]+$", url, re.IGNORECASE):
        raise ConfigError(f"--url: expected an http(s) link to the nightly's page (got {url!r})")
    return url


def check_night_name(night: str | None, now: float | None = None) -> str | None:
    """``--night``: a real date, not in the future (``YYYY-MM-DD``)."""
    if night is None:
        return None
    if not valid_night(night):
        raise ConfigError(f"--night: expected a date YYYY-MM-DD (got {night!r})")
    today = dt.datetime.fromtimestamp((time.time() if now is None else now) + CLOCK_SKEW_S, dt.timezone.utc).date()
    if dt.date.fromisoformat(night.split(".")[0]) > today:
        raise ConfigError(f"--night {night}: a date in the future (today is {today}); expected the night the "
                          "run was made")
    return night


def append_failed_night(nights: Path, outcome: str, url: str | None = None, night: str | None = None) -> Path:
    """A nightly that produced no run (it failed before its merge): a night with no records, so
    that the site names it among the nightlies that failed and ``history check`` fails on it."""
    if outcome in ("success", "unknown") or outcome not in OUTCOMES:
        raise ConfigError(f"--no-run: --outcome must say how the nightly failed (failure, cancelled, "
                          f"skipped; got {outcome!r})")
    now = time.time()
    check_night_name(night, now)
    check_url(url)
    name = night or night_of(now)
    path, n = night_path(nights, name), 2
    while path.exists():
        if night is not None:
            raise ConfigError(f"{path}: night {name} is already recorded; nights are append-only")
        path, n = night_path(nights, f"{name}.{n}"), n + 1
    _write_night(path, Night(night=path.name[:-len(SUFFIX)], run_id="", started=now, recorded=now,
                             outcome=outcome, url=url))
    return path


def night_of(started: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(started))


def _write_night(path: Path, night: Night) -> None:
    """A night file, written whole or not at all (a validated night: nothing in the future)."""
    if problem := night.problem(path.name[:-len(SUFFIX)]):
        raise ConfigError(f"{path}: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_dumps(night))
    os.replace(tmp, path)


def matrix_of(meta_config: str, config: Path) -> bool:
    """Whether a run's matrix file (as its run.json names it) is ``config``: the same file where
    the run names one that exists here; else (a relative name, or a path on the machine that ran
    it, such as a CI runner's checkout) its path ends with ``config``'s path relative to the
    checkout or the current folder."""
    from harness.core.paths import WORKSPACE

    config = Path(config).resolve()
    ran = Path(meta_config) if meta_config else None
    if ran is None:
        return False
    if ran.is_absolute() and ran.exists():
        return ran.resolve() == config
    for base in (WORKSPACE.resolve(), Path.cwd().resolve()):
        if config.is_relative_to(base):
            rel = config.relative_to(base).parts
            return ran.parts[-len(rel):] == rel
    return ran.name == config.name


def append_night(run_dir: Path, nights: Path, night: str | None = None, outcome: str = "unknown",
                 url: str | None = None, config: Path | None = None) -> tuple[Path, bool]:
    """Add one finished run to the history as a new night file; returns (path, written).

    Append-only: an existing night is never rewritten. The same run appended again is a no-op
    (a rerun of the workflow's step); another run on a night that is taken becomes ``<night>.2``,
    ``.3``, ... unless ``night`` was named explicitly, which is then an error (exit 2). A named
    night may hold a run already recorded under another (re-dated runs: see docs/history.md).
    ``config``: the nightly's matrix file; a run of another matrix is refused (None: any).
    """
    from harness.store.runs import load_run

    if outcome not in OUTCOMES:
        raise ConfigError(f"--outcome: expected one of {', '.join(OUTCOMES)} (got {outcome!r})")
    check_night_name(night)
    check_url(url)
    nights = nights_folder(nights)
    meta, records = load_run(run_dir)
    if not meta.finished:
        raise ConfigError(f"{run_dir}: the run is unfinished; only finished runs become nights")
    if config is not None and not matrix_of(meta.config, config):
        raise ConfigError(f"--run {Path(run_dir).name}: a run of {meta.config or 'an unnamed matrix'}, not of "
                          f"the nightly's matrix {config} (--config); expected a run of the matrix the "
                          "history keeps")
    name = night or night_of(meta.started)
    path = night_path(nights, name)
    for existing in scan_nights(nights).nights:     # a damaged night is named by check and publish
        if (night is None or existing.source == path) and existing.run_id == meta.run_id:
            return existing.source, False
    if path.exists():
        if night is not None:
            raise ConfigError(f"{path}: night {name} is already recorded (another run); nights are "
                              "append-only")
        n = 2
        while night_path(nights, f"{name}.{n}").exists():
            n += 1
        name, path = f"{name}.{n}", night_path(nights, f"{name}.{n}")
    _write_night(path, Night(night=name, run_id=meta.run_id, started=meta.started, ended=meta.ended,
                             recorded=time.time(), outcome=outcome, url=url, environments=installed_versions(meta),
                             records=[compact_record(r) for r in records], config=meta.config,
                             matrix_hash=meta.matrix_hash))
    return path, True
