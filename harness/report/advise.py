"""Which configuration to ship: per case and runtime, the best passing configuration and its call.

A configuration is one cell's torch release, exporter, opset and export options. Among the
passing cells (``pass`` or ``xpass``) of a case on a runtime, the best is the first by:

1. the lowest median latency (cells without one, where latency was off, come after every timed one);
2. then the smallest parity margin: ``max_abs / atol`` (how much of the tolerance the file used);
3. then the smallest file (``graph.bytes``);
4. then the newest torch release; last, the cell id (so the choice never depends on file order).

A passing cell whose file declares another opset than the cell asked for (``Record.opset_mark``,
"asked 13, got 18") is not a configuration of the requested opset: it is never ranked, only
counted (``Advice.other_opset``).

Latencies are compared as recorded; one taken on a loaded machine (``Latency.loaded``) is marked
beside the choice, since another run's figure may be the faster one in truth.

Per torch release, a case *loses* a runtime when the release has cells of that case on that
runtime that were attempted (not skipped, not the matrix's own error), none passes as asked, and
the torch release before it (in the same results) had a passing one: upgrading to it leaves no
configuration to ship.

The records come from one run, or from the store's finished runs through the advise policy of
``harness.store.reuse`` (the newest record per cell whose case files are unchanged, each run's
relative case file names read against its own matrix folder, wherever the command runs). Two
different cases with one name (another source file, in runs of another matrix) are never ranked
together: a case is its name and its source hash (the run's fingerprint), ``Sources``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness.core.record import Record
from harness.report.aggregate import torch_sort_key
from harness.report.text import md_code, md_text

# Run id → case name → the hash of the case's source (the run's fingerprint): what tells two
# different cases of one name apart.
Sources = Mapping[str, Mapping[str, Any]]

RULE = ("fastest median latency; ties: smaller parity margin (max_abs / atol), then smaller file, "
        "then newer torch, then cell id")


@dataclass(frozen=True)
class Choice:
    """One passing configuration of a case on a runtime, with what it is ranked by."""

    record: Record

    @property
    def latency_ms(self) -> float | None:
        return self.record.latency_ms.median

    @property
    def margin(self) -> float | None:
        p = self.record.parity
        return None if p.max_abs is None or not p.atol else p.max_abs / p.atol

    @property
    def file_bytes(self) -> int | None:
        size = self.record.graph.get("bytes")
        return size if isinstance(size, int) else None

    @property
    def export_call(self) -> str | None:
        call = self.record.graph.get("export_call")
        return call if isinstance(call, str) else None

    @property
    def configuration(self) -> str:
        r = self.record
        label = r.key.options.label
        return f"torch {r.torch} · {r.exporter} · opset {r.opset}" + (f" · {label}" if label else "")

    def rank(self) -> tuple:
        lat, margin, size = self.latency_ms, self.margin, self.file_bytes
        return (lat is None, lat if lat is not None else 0.0,
                margin if margin is not None else math.inf, size if size is not None else math.inf,
                _newest_first(self.record.torch), self.record.cell_id)

    def facts(self) -> str:
        """'0.195 ms · margin 0.01 · 12.3 kB' (what it was ranked by), with load marked."""
        parts = []
        if self.latency_ms is not None:
            parts.append(f"{self.latency_ms:.3g} ms" + (" (measured under load)" if self.record.latency_ms.loaded else ""))
        else:
            parts.append("no latency")
        if self.margin is not None:
            parts.append(f"margin {self.margin:.2g} of atol")
        if self.file_bytes is not None:
            parts.append(f"{self.file_bytes / 1000:.1f} kB")
        return " · ".join(parts)


def _newest_first(torch: str) -> tuple:
    v = torch_sort_key(torch)
    return tuple(-x for x in v.release)


@dataclass
class Advice:
    """The configurations of one case on one runtime: the passing ones ranked, the best first."""

    case: str
    runtime: str
    ranked: list[Choice] = field(default_factory=list)
    attempted: int = 0               # cells that ran (not skipped, not the matrix's own error)
    source: str | None = None        # the case's source hash, when the records' runs recorded it
    # Passing cells whose file declares another opset than asked ("asked 13, got 18"): never
    # ranked as the requested opset's configuration.
    other_opset: list[Record] = field(default_factory=list)

    @property
    def best(self) -> Choice | None:
        return self.ranked[0] if self.ranked else None


@dataclass(frozen=True)
class Loss:
    """At ``torch``, ``case`` has no passing configuration on ``runtime``; ``before`` had one."""

    torch: str
    case: str
    runtime: str
    before: str
    attempted: int
    source: str | None = None        # the case's source hash (see ``Advice.source``)


def case_source(rec: Record, sources: Sources | None) -> str | None:
    """The hash of the source of the case ``rec`` ran, as its run recorded it (None: unknown)."""
    value = ((sources or {}).get(rec.run_id) or {}).get(rec.case)
    return str(value) if value else None


def advise(records: Iterable[Record], case: str | None = None, runtime: str | None = None,
           sources: Sources | None = None) -> list[Advice]:
    """One ``Advice`` per (case, runtime) of the records (only ``case`` / ``runtime`` when given);
    with ``sources``, one per case source as well: two cases of one name are ranked apart."""
    out: dict[tuple[str, str, str], Advice] = {}
    for rec in records:
        if (case is not None and rec.case != case) or (runtime is not None and rec.runtime != runtime):
            continue
        source = case_source(rec, sources)
        adv = out.setdefault((rec.case, source or "", rec.runtime), Advice(rec.case, rec.runtime, source=source))
        if rec.status.attempted:
            adv.attempted += 1
        if rec.status.passed and not rec.opset_kept:
            adv.other_opset.append(rec)    # not a configuration of the opset it asked for
        elif rec.status.passed:
            adv.ranked.append(Choice(rec))
    for adv in out.values():
        adv.ranked.sort(key=Choice.rank)
    return [out[k] for k in sorted(out)]


def losses(records: Iterable[Record], sources: Sources | None = None) -> list[Loss]:
    """Per torch release, the (case, runtime) pairs that lose every passing configuration (each
    case source apart, with ``sources``)."""
    by: dict[tuple[str, str, str], dict[str, list[Record]]] = {}
    for rec in records:
        if rec.status.attempted:
            key = (rec.case, case_source(rec, sources) or "", rec.runtime)
            by.setdefault(key, {}).setdefault(rec.torch, []).append(rec)
    out = []
    for (case, source, runtime), per_torch in by.items():
        ordered = sorted(per_torch, key=torch_sort_key)
        for before, torch in zip(ordered, ordered[1:]):
            if any(_ships(r) for r in per_torch[before]) and not any(_ships(r) for r in per_torch[torch]):
                out.append(Loss(torch, case, runtime, before, len(per_torch[torch]), source or None))
    return sorted(out, key=lambda x: (torch_sort_key(x.torch), x.case, x.runtime))


def _ships(rec: Record) -> bool:
    """A configuration one could ship as asked: it passed and its file keeps the requested opset."""
    return rec.status.passed and rec.opset_kept


# ---- records to advise from -------------------------------------------------------------------

@dataclass
class Stored:
    """What the advisor reads from a store: the newest acceptable record per cell, the runs they
    came from, each run's case sources, and what was read and refused (for a useful "nothing")."""

    records: list[Record]
    runs: list[str]
    sources: dict[str, dict[str, Any]]
    scanned: int                     # finished runs read
    refused: dict[str, str]          # cell id → why its newest stored record was refused


def store_records(reports: Path) -> Stored:
    """The newest record per cell of the store's finished runs that the advise policy accepts:
    case files unchanged, each run's relative names read against its own matrix folder."""
    from harness.store.reuse import ADVISE, Wanted, reuse

    found = reuse(ADVISE, reports, Wanted(base_dir_of_run=True))
    runs = {run.meta.run_id: run for run in found.runs.values()}
    sources = {rid: dict((run.fingerprint or {}).get("cases") or {}) for rid, run in runs.items()}
    return Stored(list(found.records.values()), sorted(runs), sources, found.scanned, dict(found.refused))


# ---- rendering --------------------------------------------------------------------------------

def advice_lines(adv: Advice, losses_here: list[Loss] = (), name_source: bool = False) -> list[str]:
    """Plain text of one case on one runtime, for the command line (``name_source``: say which
    case source, when several cases share the name)."""
    source = f" (case source {adv.source[:12]})" if name_source and adv.source else \
        " (case source not recorded)" if name_source else ""
    lines = [f"{adv.case}{source} on {adv.runtime}: {len(adv.ranked)} of {adv.attempted} configuration(s) pass"]
    best = adv.best
    if best is None:
        lines.append("  no passing configuration: nothing to ship on this runtime")
    else:
        lines.append(f"  ship: {best.configuration} ({best.facts()}; cell {best.record.cell_id}, "
                     f"run {best.record.cached_from or best.record.run_id})")
        if best.export_call:
            lines += ["  export call (model: the case's model, x: its example inputs by name):"]
            lines += [f"    {line}" for line in best.export_call.splitlines()]
        else:
            lines.append("  export call: not recorded (a record from before calls were recorded, or "
                         "an exporter other than torch.onnx.export)")
        for other in adv.ranked[1:4]:
            lines.append(f"  then: {other.configuration} ({other.facts()})")
    if adv.other_opset:
        marks = sorted({f"opset {r.opset_mark}" for r in adv.other_opset})
        lines.append(f"  not counted: {len(adv.other_opset)} passing cell(s) whose file declares another opset "
                     f"than asked ({', '.join(marks)})")
    for loss in losses_here:
        lines.append(f"  torch {loss.torch} loses every passing configuration here "
                     f"(torch {loss.before} had one; {loss.attempted} cell(s) fail)")
    return lines


def advice_markdown(records: list[Record]) -> str:
    """The run report's section: the best configuration per case and runtime, and the losses."""
    advice = advise(records)
    if not any(a.attempted for a in advice):
        return ""
    rows = []
    for adv in advice:
        best = adv.best
        if best is None:
            other = (f" ({len(adv.other_opset)} pass with a file of another opset than asked: "
                     f"{', '.join(sorted({r.opset_mark for r in adv.other_opset}))})") if adv.other_opset else ""
            rows.append(f"| {md_text(adv.case)} | {md_text(adv.runtime)} | none of {adv.attempted} passes"
                        f"{md_text(other)} | | |")
            continue
        call = md_code("; ".join(best.export_call.splitlines())) if best.export_call else "not recorded"
        rows.append(f"| {md_text(adv.case)} | {md_text(adv.runtime)} | {md_text(best.configuration)} | "
                    f"{md_text(best.facts())} | {call} |")
    text = ("## Which configuration to ship\n\n"
            f"Per case and runtime, the best passing configuration of this run by the rule: {RULE}. "
            "In the call, `model` is the case's model and `x` its example inputs by name "
            "(`python -m harness advise --case NAME` prints it whole, across the stored runs).\n\n"
            "| case | runtime | configuration | ranked by | export call |\n|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n\n")
    lost = losses(records)
    if lost:
        text += ("### Torch releases that lose every passing configuration\n\n"
                 "| torch | case | runtime | last release with one |\n|---|---|---|---|\n"
                 + "\n".join(f"| {md_text(x.torch)} | {md_text(x.case)} | {md_text(x.runtime)} | {md_text(x.before)} |"
                             for x in lost) + "\n\n")
    return text


def advice_rows(records: list[Record]) -> dict[str, Any]:
    """What the HTML section shows: one row per case and runtime, and the losses."""
    rows = []
    for adv in advise(records):
        best = adv.best
        rows.append({"case": adv.case, "runtime": adv.runtime, "passing": len(adv.ranked),
                     "attempted": adv.attempted,
                     "other_opset": sorted({r.opset_mark for r in adv.other_opset}),
                     "configuration": best.configuration if best else None,
                     "facts": best.facts() if best else None,
                     "loaded": bool(best and best.record.latency_ms.loaded),
                     "call": best.export_call if best else None,
                     "cell_id": best.record.cell_id if best else None})
    return {"rule": RULE, "rows": [r for r in rows if r["attempted"]],
            "losses": [asdict(x) for x in losses(records)]}
