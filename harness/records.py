"""Result records (schema v1): one JSON object per cell, appended to results.jsonl.

This module is imported inside worker environments, so it uses the standard library only.
"""
from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from harness import SCHEMA_VERSION

STAGES = ("export", "check", "load", "run", "parity", "latency")


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    XFAIL = "xfail"
    XPASS = "xpass"
    SKIP = "skip"
    CRASH = "crash"
    TIMEOUT = "timeout"

    @property
    def is_failure(self) -> bool:
        return self in (Status.FAIL, Status.CRASH, Status.TIMEOUT)


class SchemaError(ValueError):
    """A results file this version cannot read."""


@dataclass
class Record:
    run_id: str
    case: str
    torch: str
    exporter: str
    opset: int
    runtime: str
    status: str
    stage: str | None = None
    error: str | None = None
    schema: int = SCHEMA_VERSION
    cell_id: str = ""
    env: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    opset_actual: int | None = None
    parity: dict[str, Any] = field(default_factory=dict)
    latency_ms: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    duration_s: dict[str, float] = field(default_factory=dict)
    graph: dict[str, Any] = field(default_factory=dict)
    signature: str | None = None
    hint: str | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    log: str | None = None
    bundle: str | None = None
    repro: str | None = None
    finished_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Record":
        data = migrate(dict(data))
        known = {f.name for f in fields(cls)}
        extra = {k: v for k, v in data.items() if k not in known}
        rec = cls(**{k: v for k, v in data.items() if k in known})
        if extra:
            rec.options = {**rec.options, **{f"x_{k}": v for k, v in extra.items()}}
        return rec

    @property
    def key(self) -> tuple:
        """Identity of a cell across runs: what the gate and the reports compare on."""
        return (self.case, self.exporter, self.opset, self.runtime, option_label(self.options))


def option_label(options: dict[str, Any]) -> str:
    """Short, stable label for non-default export options ('' when all defaults)."""
    parts = []
    if options.get("dynamic") is False:
        parts.append("static")
    if options.get("constant_folding") is False:
        parts.append("nofold")
    if options.get("precision") not in (None, "fp32"):
        parts.append(str(options["precision"]))
    return ",".join(parts)


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record up to the current schema; refuse newer ones."""
    version = int(data.get("schema", 0))
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"record has schema {version} but this harness reads up to {SCHEMA_VERSION}: "
            "upgrade the harness to read these results"
        )
    if version == 0:
        # Schema 0 (pre-release): 'result' instead of 'status', 'latency' instead of 'latency_ms'.
        if "result" in data and "status" not in data:
            data["status"] = data.pop("result")
        if "latency" in data and "latency_ms" not in data:
            data["latency_ms"] = data.pop("latency")
        data["schema"] = 1
    return data


def append_record(path: Path, record: Record) -> None:
    """Append one record and make it durable before returning (an interrupted run keeps it)."""
    line = record.to_json() + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: Path) -> list[Record]:
    return list(iter_records(path))


def iter_records(path: Path) -> Iterator[Record]:
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                # A torn last line from a killed run: everything before it is intact.
                continue
            try:
                yield Record.from_dict(data)
            except SchemaError as exc:
                raise SchemaError(f"{path}:{lineno}: {exc}") from None


def count_by_status(records: Iterable[Record]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
    return counts
