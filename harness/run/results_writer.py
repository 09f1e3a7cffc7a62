"""The results writer: where every record of a run goes, from any thread."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from harness.core.record import Record, append_records
from harness.core.status import Status
from harness.run.annotate import Annotator
from harness.run.progress import RunProgress
from harness.run.runner_records import with_timing


class ResultsWriter:
    """Where every record goes, from any thread: annotated (xfail, signature, hint), given its
    cache key, appended to results.jsonl, never twice. A passing verdict is held until the
    latency phase has timed it (``timing`` joins the two); so is its progress."""

    def __init__(self, results: Path, annotate: Annotator, progress: RunProgress, hold_passes: bool) -> None:
        self.results, self.annotate = results, annotate
        self.progress = progress
        self.hold_passes = hold_passes
        self.lock = threading.RLock()
        self.recorded: set[str] = set()
        self.held: dict[str, Record] = {}
        self.keys: dict[str, str | None] = {}          # cell id → its cache key, once known
        self.died: Callable[[str], bool] = lambda cid: False
        self.cached = 0

    def verdict(self, rec: Record) -> None:
        """A record from a verdict worker, or one the runner made (skip, crash, environment)."""
        self.verdicts([rec])

    def verdicts(self, records: list[Record]) -> None:
        with self.lock:
            batch = []
            for rec in records:
                if rec.cell_id in self.recorded or rec.cell_id in self.held:
                    continue
                if self.hold_passes and rec.status is Status.PASS:
                    self.held[rec.cell_id] = rec
                else:
                    batch.append(rec)
            self._write(batch)

    def timing(self, rec: Record) -> None:
        """A record from the latency phase: joined to the held verdict of its cell."""
        with self.lock:
            verdict = self.held.pop(rec.cell_id, None)
            if verdict is not None:
                self._write([with_timing(verdict, rec)])

    def from_store(self, records: list[Record]) -> None:
        """Records taken from the store by the cell cache (they keep their key)."""
        with self.lock:
            batch = [r for r in records if r.cell_id not in self.recorded and r.cell_id not in self.held]
            self.cached += len(batch)
            self._write(batch, cached=True)

    def _write(self, records: list[Record], cached: bool = False) -> None:
        """Annotate and append (one write and fsync for the batch); cached cells are summed up
        per environment by the caller instead of a line each."""
        for rec in records:
            if not cached:
                ok = rec.status in (Status.PASS, Status.FAIL, Status.SKIP) and not self.died(rec.cell_id)
                rec.cache_key = self.keys.get(rec.cell_id) if ok else None
            self.annotate(rec)
        append_records(self.results, records)
        self.recorded.update(rec.cell_id for rec in records)
        self.progress.finished(records, cached)
