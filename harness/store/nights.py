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
- ``records``: every record without its log, bundle, timing samples and per-shape details;
- ``config``, ``matrix_hash``: the run's matrix file and hash (nights appended since they exist).

Read, a night is validated against its file and the clock: its ``night`` is its file's name (so
it never names a path), no date or time lies in the future, every field has its type and every
record is one; its JSON is inflated no further than ``MAX_NIGHT_JSON``. ``scan_nights`` names a
file that fails and skips it (one damaged old night never stops the history). Nights are added by
``harness.store.nights_append``.
"""
from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.record import Record, SchemaError
from harness.core.run import RunMeta
from harness.matrix.rules import ConfigError

NIGHT_SCHEMA = 1
SUFFIX = ".json.gz"
NIGHT_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}(\.\d+)?$")
OUTCOMES = ("success", "failure", "cancelled", "skipped", "unknown")
# A night's JSON is read up to this size and refused beyond it, without inflating the rest (a
# night of the default matrix is ~1 MiB of JSON, 50-70 KiB compressed).
MAX_NIGHT_JSON = 64 * 2**20
# How far ahead of this machine's clock a night's start may be (another machine's clock).
CLOCK_SKEW_S = 600.0


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
    config: str = ""            # the matrix file of the run (as run.json names it)
    matrix_hash: str = ""
    source: Path | None = field(default=None, compare=False, repr=False)    # the file it was read from
    _parsed: list[Record] | None = field(default=None, compare=False, repr=False)

    @property
    def date(self) -> dt.date:
        return dt.date.fromisoformat(self.night.split(".")[0])

    def to_records(self) -> list[Record]:
        if self._parsed is None:
            self._parsed = [Record.from_dict(r) for r in self.records]
        return list(self._parsed)

    def meta(self) -> RunMeta:
        """A run's metadata as far as a night keeps it (for the run page of that night)."""
        return RunMeta(run_id=self.run_id, started=self.started, ended=self.ended, finished=True,
                       config=f"night {self.night}")

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": self.schema, "night": self.night, "run_id": self.run_id, "started": self.started,
               "ended": self.ended, "recorded": self.recorded, "outcome": self.outcome, "url": self.url,
               "environments": self.environments, "records": self.records}
        return {**out, **{k: v for k, v in (("config", self.config), ("matrix_hash", self.matrix_hash)) if v}}

    @classmethod
    def from_dict(cls, data: Any, where: str, name: str | None = None, now: float | None = None) -> Night:
        """A night, validated: every field of its type, its name ``name`` (the file's), nothing
        in the future, every record a record (``SchemaError`` naming ``where`` otherwise)."""
        if not isinstance(data, dict) or not isinstance(data.get("night"), str) \
                or not isinstance(data.get("records"), list) or not isinstance(data.get("run_id"), str):
            raise SchemaError(f"{where}: not a night (expected an object with 'night', 'run_id' and "
                              "a list 'records')")
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
            raise SchemaError(f"{where}: key 'schema': expected a night schema number (got {schema!r})")
        if schema > NIGHT_SCHEMA:
            raise SchemaError(f"{where}: written by a newer harness (night schema {schema}); "
                              "upgrade to read it")
        keys = ("night", "run_id", "started", "ended", "recorded", "outcome", "url", "environments",
                "records", "schema", "config", "matrix_hash")
        night = cls(**{k: data[k] for k in keys if k in data})
        if problem := night.problem(name, now):
            raise SchemaError(f"{where}: {problem}")
        parsed = []
        for i, rec in enumerate(night.records):
            try:
                parsed.append(Record.from_dict(rec))
            except SchemaError as exc:
                raise SchemaError(f"{where}: key 'records[{i}]': {exc}") from None
        night._parsed = parsed
        return night

    def problem(self, name: str | None = None, now: float | None = None) -> str | None:
        """What makes this night unreadable as history (None: nothing)."""
        if not valid_night(self.night):
            return f"key 'night': expected a date YYYY-MM-DD[.N] (got {self.night!r})"
        if name is not None and self.night != name:
            return f"key 'night' is {self.night!r}, not the file's name {name!r}"
        limit = (time.time() if now is None else now) + CLOCK_SKEW_S
        for key in ("started", "recorded", "ended"):
            value = getattr(self, key)
            if value is None and key == "ended":
                continue
            if not _finite(value):
                return f"key '{key}': expected a time in seconds since 1970 (got {value!r})"
            if value > limit:
                return f"key '{key}': {_utc(value)} is in the future (now {_utc(limit - CLOCK_SKEW_S)})"
        if self.date > dt.datetime.fromtimestamp(limit, dt.timezone.utc).date():
            return f"night {self.night} is a date in the future"
        if self.outcome not in OUTCOMES:
            return f"key 'outcome': expected one of {', '.join(OUTCOMES)} (got {self.outcome!r})"
        if not isinstance(self.config, str) or not isinstance(self.matrix_hash, str):
            return "keys 'config' and 'matrix_hash': expected text"
        if self.url is not None and not isinstance(self.url, str):
            return f"key 'url': expected a link or null (got {type(self.url).__name__})"
        if not isinstance(self.environments, dict) or not all(
                isinstance(v, dict) and all(isinstance(x, str) for x in v.values()) for v in self.environments.values()):
            return "key 'environments': expected {environment: {package: version}}"
        return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when))


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


def _inflate(path: Path) -> bytes:
    """The JSON a night file holds, inflated no further than ``MAX_NIGHT_JSON``: a small file
    holding a huge document is refused by its size, not read whole."""
    with path.open("rb") as fh, gzip.GzipFile(fileobj=fh) as gz:
        data = gz.read(MAX_NIGHT_JSON + 1)
    if len(data) > MAX_NIGHT_JSON:
        raise SchemaError(f"{path}: holds more than {MAX_NIGHT_JSON // 2**20} MiB of JSON; expected a night "
                          "file (a night of the default matrix is about 1 MiB)")
    return data


def read_night(path: Path, now: float | None = None) -> Night:
    """One night file, validated against its name and the clock (``SchemaError`` naming it)."""
    path = Path(path)
    try:
        data = json.loads(_inflate(path))
    except SchemaError:
        raise
    except (OSError, EOFError, ValueError, UnicodeDecodeError, zlib.error, RecursionError) as exc:
        raise SchemaError(f"{path}: not a gzip-compressed JSON night ({exc})") from None
    night = Night.from_dict(data, str(path), path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else None, now)
    night.source = path
    return night


def nights_folder(nights: Path, option: str = "--nights") -> Path:
    """``nights`` as a folder of night files (it need not exist yet); a file there is bad input."""
    nights = Path(nights)
    if nights.exists() and not nights.is_dir():
        raise ConfigError(f"{option} {nights}: is a file; expected a folder of night files")
    return nights


def night_files(nights: Path) -> list[Path]:
    """Every night file, oldest first (by name: the date, then a second run's ``.N``)."""
    nights = nights_folder(nights)
    if not nights.is_dir():
        return []
    files = [p for p in nights.iterdir() if p.name.endswith(SUFFIX) and valid_night(p.name[:-len(SUFFIX)])]
    return sorted(files, key=lambda p: _order(p.name[:-len(SUFFIX)]))


@dataclass
class NightScan:
    """The readable nights of a folder (oldest first) and the files that are not, each with why."""

    nights: list[Night]
    damaged: list[tuple[Path, str]]
    files: list[Path]

    @property
    def newest_damaged(self) -> str | None:
        """Why the newest night file cannot be read (None: it can, or there is none)."""
        if self.files and self.damaged and self.damaged[-1][0] == self.files[-1]:
            return self.damaged[-1][1]
        return None


def scan_nights(nights: Path, warn: Callable[[str], None] | None = None, now: float | None = None) -> NightScan:
    """Every night of a folder; one that cannot be read is named to ``warn`` and skipped (an old
    damaged night never stops the history)."""
    files = night_files(nights)
    out, damaged = [], []
    for path in files:
        try:
            out.append(read_night(path, now))
        except SchemaError as exc:
            damaged.append((path, str(exc)))
            if warn is not None:
                warn(f"warning: skipping night file {exc}")
    return NightScan(out, damaged, files)


def _order(name: str) -> tuple[str, int]:
    day, _, n = name.partition(".")
    return day, int(n or 1)


def read_nights(nights: Path) -> list[Night]:
    """Every night of a folder; the first that cannot be read raises ``SchemaError``."""
    return [read_night(p) for p in night_files(nights)]


def iter_nights(nights: Path) -> Iterator[Night]:
    for p in night_files(nights):
        yield read_night(p)


