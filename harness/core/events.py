"""What a worker tells the runner: one JSON object per line on the events pipe, each one of the
types below (``event`` names the type; every event carries the ``pid`` of the process that sent
it). Standard library only: the worker imports this inside every environment.

The order a verdict worker sends them in::

    hello                             the warm parent, once: package versions, nothing run yet
    (want)                            the parent asks for one more group (pull mode)
    group_start  stage*  (cell_start stage* record)*     from the group's own process
    ...
    bye                               the parent, last: a worker without it ended early

A group runs in a process of its own, forked from the warm parent: its events carry the child's
``pid`` and, in ``group_start``, the ``parent`` it was forked from, so that the runner tells the
group's process from a process a case forked (whose events are never counted).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


class EventError(ValueError):
    """A line on the events pipe that is not one of the worker's events."""


@dataclass(frozen=True)
class WorkerEvent:
    kind: ClassVar[str] = ""
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        # The fields as they are, not ``asdict``'s deep copy: an event is written out at once, and
        # a record's samples (up to a thousand floats) made the copy most of a latency event's cost.
        return {"event": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True)
class Hello(WorkerEvent):
    kind: ClassVar[str] = "hello"
    versions: dict[str, Any] = field(default_factory=dict)
    # True: every group runs in a fresh process forked from this one (which cleans up after it).
    fresh: bool = False
    preloaded: list[str] = field(default_factory=list)   # modules imported before the first fork
    threads: int | None = None    # this process's threads when it said hello (before any fork)
    scratch: str | None = None    # its scratch folder: the runner removes it if the worker is ended first


@dataclass(frozen=True)
class Want(WorkerEvent):
    kind: ClassVar[str] = "want"


@dataclass(frozen=True)
class GroupStart(WorkerEvent):
    kind: ClassVar[str] = "group_start"
    gid: str = ""
    parent: int | None = None     # the warm parent that forked this group's process


@dataclass(frozen=True)
class StageStart(WorkerEvent):
    """A stage begins: of the group (reference, export, check) or of the current cell."""

    kind: ClassVar[str] = "stage"
    stage: str = ""


@dataclass(frozen=True)
class CellStart(WorkerEvent):
    kind: ClassVar[str] = "cell_start"
    cell_id: str = ""


@dataclass(frozen=True)
class RecordDone(WorkerEvent):
    """A cell's record (``Record.to_dict``; validated by the runner with ``Record.from_dict``)."""

    kind: ClassVar[str] = "record"
    record: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bye(WorkerEvent):
    kind: ClassVar[str] = "bye"


EVENT_TYPES: dict[str, type[WorkerEvent]] = {
    cls.kind: cls for cls in (Hello, Want, GroupStart, StageStart, CellStart, RecordDone, Bye)}


def event_from_dict(data: Any) -> WorkerEvent:
    """The typed event of one decoded line; ``EventError`` for anything else."""
    if not isinstance(data, dict) or data.get("event") not in EVENT_TYPES:
        raise EventError(f"not a worker event: {str(data)[:80]!r}")
    cls = EVENT_TYPES[data["event"]]
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise EventError(f"malformed {data['event']!r} event: {exc}") from exc
