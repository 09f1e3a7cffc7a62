"""Remedies seen to work, from the matrix's own cells, and the hint that says them (runner side).

A failing cell's blame (``harness.worker.diagnose.layers``) carries the remedies its own
experiments showed (``optimize=False``, the native opset, inlined functions). After the run this
pass adds the ones the run's other cells show on the same case and runtime: another opset with the
same exporter and torch, the other exporter on the same torch, the same cell on a newer torch
("fixed in torch X"). The hint is then written from the blame alone (``Blame.hint``): one source
of truth per cell, naming only remedies seen to work, or "nothing tried works".
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from harness.core.record import Record


def version_key(version: str) -> Version:
    try:
        return Version(version.split("+")[0])
    except InvalidVersion:
        return Version("0")


def _axes(rec: Record) -> tuple[str, str, str]:
    opts = {k: v for k, v in sorted(rec.options.items()) if k not in ("dim_marking",)}
    return rec.case, rec.runtime, repr(opts)


def passing_by_axes(records: list[Record]) -> dict[tuple[str, str, str], list[Record]]:
    """The run's passing records by case, runtime and options (``_axes``)."""
    out: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        if r.status.passed:
            out.setdefault(_axes(r), []).append(r)
    return out


def matrix_remedies(rec: Record, records: list[Record],
                    passing: dict[tuple[str, str, str], list[Record]] | None = None) -> list[str]:
    """What passes in this run where ``rec`` fails, changing one thing, nearest first
    (``passing``: ``passing_by_axes(records)``, made once for a pass over many records)."""
    passing = passing_by_axes(records) if passing is None else passing
    same = [r for r in passing.get(_axes(rec), []) if r is not rec]
    found: list[str] = []
    # a cell whose file is not at the opset it asked for (the converter silently kept 18) does
    # not show that opset works
    opsets = sorted({r.opset for r in same if r.torch == rec.torch and r.exporter == rec.exporter
                     and r.opset != rec.opset and r.opset_actual in (None, r.opset)}, key=lambda o: abs(o - rec.opset))
    if opsets:
        found.append(f"opset {', '.join(map(str, opsets))} (passes in this run: {rec.exporter}, torch {rec.torch})")
    other = sorted({(r.exporter, r.opset) for r in same if r.torch == rec.torch and r.exporter != rec.exporter},
                   key=lambda eo: (eo[1] != rec.opset, eo))
    if other:
        exporter = other[0][0]
        found.append(f"the {exporter} exporter (passes in this run at opset "
                     f"{', '.join(str(o) for e, o in other if e == exporter)}, torch {rec.torch})")
    newer = sorted({r.torch for r in same if r.exporter == rec.exporter and r.opset == rec.opset
                    and version_key(r.torch) > version_key(rec.torch)}, key=version_key)
    if newer:
        found.append(f"torch {newer[0]} (fixed there: the same cell passes in this run)")
    return found


def add_remedies(records: list[Record], hint: Callable[[Record], str | None] | None = None) -> int:
    """Add the matrix's remedies to every failing blamed record and rewrite its hint (``hint``:
    the annotator's, which starts from the blame); the count of records changed."""
    if hint is None:
        from harness.run.annotate import Annotator

        hint = Annotator(xfail=[]).hint
    changed = 0
    passing = passing_by_axes(records)
    for rec in records:
        blame = rec.blame
        if blame is None or not rec.status.is_failure or not blame.layer:
            continue
        seen = [r for r in blame.remedies if "in this run" not in r and "fixed there" not in r]
        remedies = seen + [r for r in matrix_remedies(rec, records, passing) if r not in seen]
        before = (list(blame.remedies), rec.hint)
        blame.remedies = remedies
        rec.hint = hint(rec)
        changed += (list(blame.remedies), rec.hint) != before
    return changed


def remedies_run(run_dir: Path) -> int:
    """The pass over a finished run's results.jsonl (rewritten only when something changed)."""
    from harness.core.record import read_records

    results = Path(run_dir) / "results.jsonl"
    if not results.exists():
        return 0
    records = read_records(results)
    changed = add_remedies(records)
    if changed:
        tmp = results.with_name(results.name + ".remedies")
        tmp.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
        os.replace(tmp, results)
    return changed
