"""The nightly history: one compact, append-only file per night (``nights/<night>.json.gz``).

The nightly workflow keeps these on a ``results`` branch (see docs/history.md): each night adds one
file and never rewrites another, so the branch is the durable, versioned record of every night at
no cost. A night file holds what the reports and the gate read of a run, not its logs, bundles or
latency samples (those stay workflow artifacts with their retention, linked by ``url``):

- ``night``: its name, the run's UTC start date (``2026-12-01``; ``2026-12-01.2`` for a second run
  that day); ``run_id``, ``started``, ``ended``, ``recorded`` (when appended);
- ``outcome``: how the nightly that produced it ended (``success``, ``failure``, ...) and ``url``;
- ``environments``: per environment of the run, its installed packages (``name → version``), which
  name the torch, companion and runtime versions that changed between two nights;
- ``records``: every record without its log, bundle, timing samples and per-shape details.

Written gzip-compressed with a fixed header (no name or time in it), keys sorted.
"""
from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from harness.core.record import Record, SchemaError
from harness.core.run import RunMeta
from harness.matrix.rules import ConfigError

NIGHT_SCHEMA = 1
SUFFIX = ".json.gz"
NIGHT_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}(\.\d+)?$")
# Record fields a night leaves out: where the run's files were, and per-sample detail.
DROPPED = ("log", "bundle", "repro", "graph", "duration_s", "notes", "cache_key", "finished_at")
ERROR_CHARS = 600
OUTCOMES = ("success", "failure", "cancelled", "skipped", "unknown")


@dataclass
class Night:
    """One night of the history: a run's compact records and what the nightly knew of it."""

    night: str
    run_id: str
    started: float
    ended: float | None = None
    recorded: float = 0.0
    outcome: str = "unknown"
    url: str | None = None
    environments: dict[str, dict[str, str]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    schema: int = NIGHT_SCHEMA

    @property
    def date(self) -> dt.date:
        return dt.date.fromisoformat(self.night.split(".")[0])

    def to_records(self) -> list[Record]:
        return [Record.from_dict(r) for r in self.records]

    def meta(self) -> RunMeta:
        """A run's metadata as far as a night keeps it (for the run page of that night)."""
        return RunMeta(run_id=self.run_id, started=self.started, ended=self.ended, finished=True,
                       config=f"night {self.night}")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "night": self.night, "run_id": self.run_id, "started": self.started,
                "ended": self.ended, "recorded": self.recorded, "outcome": self.outcome, "url": self.url,
                "environments": self.environments, "records": self.records}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Night":
        if not isinstance(data, dict) or not isinstance(data.get("night"), str) \
                or not isinstance(data.get("records"), list) or not isinstance(data.get("run_id"), str):
            raise SchemaError(f"{where}: not a night (expected an object with 'night', 'run_id' and "
                              "a list 'records')")
        if int(data.get("schema", 1)) > NIGHT_SCHEMA:
            raise SchemaError(f"{where}: written by a newer harness (night schema {data['schema']}); "
                              "upgrade to read it")
        keys = ("night", "run_id", "started", "ended", "recorded", "outcome", "url", "environments",
                "records", "schema")
        return cls(**{k: data[k] for k in keys if k in data})


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
        out["blame"] = {k: v for k, v in rec.blame.to_dict().items() if k in ("party", "reason", "repository")}
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


def valid_night(name: str) -> bool:
    """``YYYY-MM-DD`` (a real date), optionally ``.N`` for a later run that day."""
    if not NIGHT_NAME.match(name):
        return False
    try:
        dt.date.fromisoformat(name.split(".")[0])
    except ValueError:
        return False
    return True


def night_path(nights: Path, name: str) -> Path:
    return Path(nights) / f"{name}{SUFFIX}"


def _dumps(night: Night) -> bytes:
    buf = io.BytesIO()
    # mtime=0 and no file name: the same night gives the same bytes (git stores it once).
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="", compresslevel=9) as gz:
        gz.write(json.dumps(night.to_dict(), sort_keys=True, separators=(",", ":"), default=str).encode())
    return buf.getvalue()


def read_night(path: Path) -> Night:
    path = Path(path)
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: not a gzip-compressed JSON night ({exc})") from None
    return Night.from_dict(data, str(path))


def night_files(nights: Path) -> list[Path]:
    """Every night file, oldest first (by name: the date, then a second run's ``.N``)."""
    nights = Path(nights)
    if not nights.is_dir():
        return []
    files = [p for p in nights.iterdir() if p.name.endswith(SUFFIX) and valid_night(p.name[:-len(SUFFIX)])]
    return sorted(files, key=lambda p: _order(p.name[:-len(SUFFIX)]))


def _order(name: str) -> tuple[str, int]:
    day, _, n = name.partition(".")
    return day, int(n or 1)


def read_nights(nights: Path) -> list[Night]:
    return [read_night(p) for p in night_files(nights)]


def iter_nights(nights: Path) -> Iterator[Night]:
    for p in night_files(nights):
        yield read_night(p)


def append_failed_night(nights: Path, outcome: str, url: str | None = None, night: str | None = None) -> Path:
    """A nightly that produced no run (it failed before its merge): a night with no records, so
    that the site names it among the nightlies that failed and ``history check`` fails on it."""
    if outcome in ("success", "unknown") or outcome not in OUTCOMES:
        raise ConfigError(f"--no-run: --outcome must say how the nightly failed (failure, cancelled, "
                          f"skipped; got {outcome!r})")
    if night is not None and not valid_night(night):
        raise ConfigError(f"--night: expected a date YYYY-MM-DD (got {night!r})")
    now = time.time()
    name = night or night_of(now)
    path, n = night_path(nights, name), 2
    while path.exists():
        if night is not None:
            raise ConfigError(f"{path}: night {name} is already recorded; nights are append-only")
        path, n = night_path(nights, f"{name}.{n}"), n + 1
    data = Night(night=path.name[:-len(SUFFIX)], run_id="", started=now, recorded=now, outcome=outcome, url=url)
    Path(nights).mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_dumps(data))
    os.replace(tmp, path)
    return path


def night_of(started: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(started))


def append_night(run_dir: Path, nights: Path, night: str | None = None, outcome: str = "unknown",
                 url: str | None = None) -> tuple[Path, bool]:
    """Add one finished run to the history as a new night file; returns (path, written).

    Append-only: an existing night is never rewritten. The same run appended again is a no-op
    (a rerun of the workflow's step); another run on a night that is taken becomes ``<night>.2``,
    ``.3``, ... unless ``night`` was named explicitly, which is then an error (exit 2). A named
    night may hold a run already recorded under another (re-dated runs: see docs/history.md).
    """
    from harness.store.runs import load_run

    if outcome not in OUTCOMES:
        raise ConfigError(f"--outcome: expected one of {', '.join(OUTCOMES)} (got {outcome!r})")
    if night is not None and not valid_night(night):
        raise ConfigError(f"--night: expected a date YYYY-MM-DD (got {night!r})")
    meta, records = load_run(run_dir)
    if not meta.finished:
        raise ConfigError(f"{run_dir}: the run is unfinished; only finished runs become nights")
    nights = Path(nights)
    name = night or night_of(meta.started)
    path = night_path(nights, name)
    for existing in night_files(nights):
        if (night is None or existing == path) and read_night(existing).run_id == meta.run_id:
            return existing, False
    if path.exists():
        if night is not None:
            raise ConfigError(f"{path}: night {name} is already recorded (another run); nights are "
                              "append-only")
        n = 2
        while night_path(nights, f"{name}.{n}").exists():
            n += 1
        name, path = f"{name}.{n}", night_path(nights, f"{name}.{n}")
    data = Night(night=name, run_id=meta.run_id, started=meta.started, ended=meta.ended,
                 recorded=time.time(), outcome=outcome, url=url, environments=installed_versions(meta),
                 records=[compact_record(r) for r in records])
    nights.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_dumps(data))
    os.replace(tmp, path)
    return path, True
