"""Verdict per cell (case, exporter, opset, runtime, options) between baseline and candidate.

Classes follow asv compare: a new failure, a parity drift beyond the case's budget or a slower
median that is also statistically significant is a regression (blocks); fixed, faster, known
failure (xfail), known failure now passing (xpass), still failing, not comparable, cannot tell
(latency) and unchanged are reported but never block. A latency verdict from stored records is
only the first look: ``harness.gate.retime`` times the cells it flags interleaved and decides.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from harness.core.cell import CellKey
from harness.core.files import differing_case_files
from harness.core.record import Record, layer_change
from harness.core.status import Stage, Status
from harness.gate.deploy import deploy_failure, deploy_unchecked, floor_raised
from harness.gate.sources import Side
from harness.gate.stats import (
    DEFAULT_ALPHA,
    DEFAULT_CONFIDENCE,
    DEFAULT_RATIO,
    Interleaved,
    LatencyChange,
    compare_intervals,
    compare_latency,
    discount_load,
    mann_whitney_u,
)
from harness.report.drift import GraphDrift, cell_drift, fusions
from harness.run.annotate import Annotator
from harness.store.provenance import same_code

# A candidate may use this share of the case's atol more than the baseline did before it counts.
DEFAULT_PARITY_FACTOR = 0.5


class Verdict(str, enum.Enum):
    NEW_FAILURE = "new failure"
    FAILS_EARLIER = "fails earlier"         # failed before too, now at an earlier stage
    PARITY_DRIFT = "parity drift"
    FUSION_LOST = "fusion lost"             # a pipeline step fuses fewer operators than before
    INTERFACE_CHANGE = "interface change"   # only with --block-on io
    SLOWER = "slower"
    FIXED = "fixed"
    FASTER = "faster"
    XFAIL = "known failure"
    XPASS = "known failure now passing"
    STILL_FAILING = "still failing"
    NOT_COMPARABLE = "not comparable"
    CANNOT_TELL = "cannot tell"             # statuses and parity compared; the latency could not be told
    UNCHANGED = "unchanged"

    @property
    def blocking(self) -> bool:
        return self in (Verdict.NEW_FAILURE, Verdict.FAILS_EARLIER, Verdict.PARITY_DRIFT,
                        Verdict.FUSION_LOST, Verdict.INTERFACE_CHANGE, Verdict.SLOWER)

    @property
    def mark(self) -> str:
        """asv compare's change column: ! failed, + worse, - better, x not comparable."""
        return {Verdict.NEW_FAILURE: "!", Verdict.FAILS_EARLIER: "!", Verdict.PARITY_DRIFT: "+", Verdict.SLOWER: "+",
                Verdict.FUSION_LOST: "+",
                Verdict.INTERFACE_CHANGE: "+",
                Verdict.FIXED: "-", Verdict.FASTER: "-", Verdict.NOT_COMPARABLE: "x",
                Verdict.XPASS: "?", Verdict.CANNOT_TELL: "~"}.get(self, " ")


@dataclass(frozen=True)
class Settings:
    latency_threshold: float = DEFAULT_RATIO
    alpha: float = DEFAULT_ALPHA
    parity_factor: float = DEFAULT_PARITY_FACTOR
    block_on: tuple[str, ...] = ()     # graph drift that blocks: "io" (input/output names, dynamic dims)
    # The share of the expected cells (see ``Coverage``) that must be compared for the gate to
    # say anything; below it the gate exits 2 ("cannot tell"), never 0.
    min_compared: float = 1.0
    confidence: float = DEFAULT_CONFIDENCE   # of the interleaved ratio's interval


@dataclass
class CellComparison:
    key: CellKey
    verdict: Verdict
    base: Record | None
    cand: Record | None
    detail: str = ""
    latency: LatencyChange | None = None
    remeasured: bool = False
    notes: list[str] = field(default_factory=list)   # e.g. a loaded first look, modes across processes
    drift: GraphDrift | None = None    # what changed in the exported file (information by default)
    deploy_unchecked: str | None = None   # why the deployed release was not tried on the candidate's file
    interleaved: Interleaved | None = None   # the interleaved A/B timing (harness.gate.retime)
    attribution: str | None = None     # of a slower cell: "file", "stack", "both" or "neither"

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def layer_change(self) -> str | None:
        """A failure that moved between layers of the stack from baseline to candidate ('the
        optimizer → the translation' is news even where the verdict is 'still failing')."""
        return layer_change(self.base, self.cand)

    def to_dict(self) -> dict[str, Any]:
        k, lat = self.key, self.latency
        return {
            "case": k.case, "exporter": k.exporter, "opset": k.opset, "runtime": k.runtime,
            "options": k.options.label,
            "verdict": self.verdict.value, "blocking": self.verdict.blocking, "detail": self.detail,
            "baseline": _side_dict(self.base), "candidate": _side_dict(self.cand),
            "latency": None if lat is None else {"ratio": lat.ratio, "p_value": lat.p_value,
                                                 "base_median": lat.base_median,
                                                 "cand_median": lat.cand_median, "method": lat.method,
                                                 "intervals": lat.intervals,
                                                 **({"ratio_interval": list(lat.ratio_interval)}
                                                    if lat.ratio_interval else {})},
            "remeasured": self.remeasured, "notes": self.notes,
            **({"interleaved": self.interleaved.to_dict()} if self.interleaved is not None else {}),
            **({"attribution": self.attribution} if self.attribution else {}),
            **({"drift": self.drift.to_dict()} if self.drift is not None else {}),
            **({"blame": self.cand.blame.to_dict()} if self.cand is not None and self.cand.blame else {}),
            **({"layer_change": self.layer_change} if self.layer_change else {}),
        }



def _side_dict(rec: Record | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {"run_id": rec.run_id, "cell_id": rec.cell_id, "torch": rec.torch,
            "status": rec.status.value, "stage": rec.stage, "error": rec.error, "reason": rec.reason,
            "max_abs": rec.parity.max_abs, "atol": rec.parity.atol,
            "latency_median_ms": rec.latency_ms.median}


def reannotate(rec: Record, annotate: Annotator) -> Record:
    """Apply the gate config's known failures, not the ones in force when the run was made."""
    raw = {Status.XFAIL: Status.FAIL, Status.XPASS: Status.PASS}
    rec = replace(rec, status=raw.get(rec.status, rec.status),
                  reason=None if rec.status in raw else rec.reason)
    return annotate(rec)


def compare_statuses(base: Record, cand: Record) -> tuple[Verdict, str] | None:
    """The verdict decided by statuses alone, or None when both passed."""
    where = lambda r: f"{r.status} at {r.stage}" if r.stage else r.status
    if Status.ERROR in (base.status, cand.status):
        # The matrix's own code failed on that side: it says nothing about the model.
        side = "baseline" if base.status is Status.ERROR else "candidate"
        rec = base if side == "baseline" else cand
        return Verdict.NOT_COMPARABLE, f"the matrix's own error on {side}: {rec.error or ''}".strip()
    if Status.SKIP in (base.status, cand.status):
        side = "baseline" if base.status is Status.SKIP else "candidate"
        rec = base if side == "baseline" else cand
        return Verdict.NOT_COMPARABLE, f"skipped on {side}: {rec.reason or rec.error or ''}".strip()
    if cand.status is Status.XPASS:
        broken = opset_change(base, cand)
        if broken is not None and broken[0]:
            # It runs, but not at the opset it was asked for: the known failure is still there.
            return Verdict.XFAIL, f"{cand.reason or ''} ({broken[1]})".strip()
        return Verdict.XPASS, cand.reason or ""
    if cand.status is Status.XFAIL:
        return Verdict.XFAIL, cand.reason or ""
    base_bad = base.status.is_failure or base.status is Status.XFAIL
    if base_bad and cand.status.is_failure:
        stages = f"{base.stage} → {cand.stage}" if base.stage != cand.stage else str(cand.stage)
        if _stage_rank(cand.stage) < _stage_rank(base.stage):
            # It exported (or loaded, ran) before and no longer gets that far: a regression
            # among red cells, whatever the error.
            return Verdict.FAILS_EARLIER, f"fails earlier: {stages}: {cand.error or ''}".strip(": ")
        return Verdict.STILL_FAILING, stages
    if base_bad:
        return Verdict.FIXED, f"was {where(base)}"
    if cand.status.is_failure:
        return Verdict.NEW_FAILURE, f"{where(cand)}: {cand.error or ''}".strip()
    return None


_STAGES = [s.value for s in Stage]


def _stage_rank(stage: str | None) -> int:
    """A stage's place in the order cells go through (unknown stages: after every one)."""
    return _STAGES.index(stage) if stage in _STAGES else len(_STAGES)


def opset_change(base: Record, cand: Record) -> tuple[bool, str] | None:
    """The requested opset is a promise. (blocking, why) when the two sides differ in keeping it:
    a candidate whose file declares another opset than the cell asked for, where the baseline's
    kept it, is a new failure of the requested opset ("asked 13, got 18") whatever its runtime
    said; a candidate that keeps it where the baseline did not gets a note. None otherwise (both
    sides' files are then the same kind and compare as they are)."""
    if base.opset_kept == cand.opset_kept:
        return None
    if not cand.opset_kept and base.opset_kept:
        return True, f"opset not kept: {cand.opset_mark} (the baseline's file declares {base.opset})"
    return False, f"the candidate keeps opset {cand.opset} (the baseline's file: {base.opset_mark})"


def compare_parity(base: Record, cand: Record, factor: float) -> str | None:
    """Why the candidate's worst error drifted beyond its budget, or None."""
    b, c = base.parity.max_abs, cand.parity.max_abs
    atol = cand.parity.atol or base.parity.atol
    if b is None or c is None or not atol:
        return None
    budget = factor * atol
    if c - b > budget:
        return f"max_abs {b:.3g} → {c:.3g} (+{c - b:.3g} > {factor:g}×atol = {budget:.3g})"
    return None


def compare_fusions(base: Record, cand: Record) -> str | None:
    """Why the candidate's pipeline fuses fewer operators than the baseline's (the model then
    runs, unfused and slower, with no error anywhere), or None."""
    b, c = fusions(base.graph), fusions(cand.graph)
    lost = [f"{k} {n} → {c.get(k, 0)}" for k, n in sorted(b.items()) if c.get(k, 0) < n]
    return f"fewer fused operators: {', '.join(lost)}" if lost else None


def compare_timing(base: Record, cand: Record, settings: Settings) -> LatencyChange | None:
    """Recorded medians and intervals where both records have them; else the samples (records
    written before intervals were recorded)."""
    b, c = base.latency_ms, cand.latency_ms
    if b.threads != c.threads:
        return None
    if b.interval and c.interval and b.median is not None and c.median is not None:
        p = mann_whitney_u(c.samples, b.samples).p_value if len(b.samples) > 1 and len(c.samples) > 1 else None
        change = compare_intervals(b.median, b.interval, c.median, c.interval, settings.latency_threshold, p)
    elif not b.samples or not c.samples:
        return None
    else:
        change = compare_latency(b.samples, c.samples, settings.latency_threshold, settings.alpha)
    return discount_load(change, b.loaded, c.loaded)


def timing_detail(lat: LatencyChange) -> str:
    if lat.method == "interval" and lat.intervals:
        (bl, bh), (cl, ch) = lat.intervals
        return (f"median ×{lat.ratio:.2f} (median intervals {bl:.3g}–{bh:.3g} → {cl:.3g}–{ch:.3g} ms, "
                "no overlap)")
    return f"median ×{lat.ratio:.2f} (p={lat.p_value:.2g})"


def compare_cell(key: CellKey, base: Record | None, cand: Record | None, settings: Settings,
                 code_match: bool | None) -> CellComparison:
    if base is None or cand is None:
        where = "baseline" if base is None else "candidate"
        return CellComparison(key, Verdict.NOT_COMPARABLE, base, cand, f"no result on {where}")
    if code_match is False:
        return CellComparison(key, Verdict.NOT_COMPARABLE, base, cand,
                              "case source or harness code differs between the two runs")
    differing = differing_case_files(base.case_files, cand.case_files)
    if differing:
        more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
        return CellComparison(key, Verdict.NOT_COMPARABLE, base, cand,
                              f"files the case loaded differ between the two runs: {', '.join(differing[:3])}{more}")
    decided = compare_statuses(base, cand)
    if decided is not None:
        return CellComparison(key, decided[0], base, cand, decided[1])
    opset = opset_change(base, cand)
    if opset is not None and opset[0]:
        return CellComparison(key, Verdict.NEW_FAILURE, base, cand, opset[1])
    drift = compare_parity(base, cand, settings.parity_factor)
    lat = compare_timing(base, cand, settings)
    if lost := compare_fusions(base, cand):
        return CellComparison(key, Verdict.FUSION_LOST, base, cand, lost, lat)
    if drift:
        return CellComparison(key, Verdict.PARITY_DRIFT, base, cand, drift, lat)
    if lat is not None and lat.significant:
        verdict = Verdict.SLOWER if lat.slower else Verdict.FASTER
        return CellComparison(key, verdict, base, cand, timing_detail(lat), lat)
    cell = CellComparison(key, Verdict.UNCHANGED, base, cand, "", lat)
    if lat is not None and lat.load_note:
        cell.notes.append(lat.load_note)
    if opset is not None:
        cell.notes.append(opset[1])
    return cell


def compare_sides(base: Side, cand: Side, annotate: Annotator, settings: Settings,
                  deploy: Mapping[str, str] | None = None) -> list[CellComparison]:
    """One comparison per cell key present on either side, in a stable order; ``deploy``: the
    gate's matrix's deployed release per runtime (each passing candidate file must be tried there)."""
    by_base = {r.key: reannotate(r, annotate) for r in base.records}
    by_cand = {r.key: reannotate(r, annotate) for r in cand.records}
    out = []
    for key in sorted(set(by_base) | set(by_cand), key=lambda k: tuple(map(str, k.as_tuple()))):
        b, c = by_base.get(key), by_cand.get(key)
        match = None
        if b is not None and c is not None:
            match = same_code(base.fingerprints.get(b.run_id), cand.fingerprints.get(c.run_id), key.case)
        cell = compare_cell(key, b, c, settings, match)
        cell.drift = cell_drift(b, c)
        block_on_drift(cell, settings)
        block_on_deploy(cell, deploy)
        out.append(cell)
    return out


# Verdicts of cells whose file worked on the matrix's own runtime release on the candidate side.
_CANDIDATE_PASSED = (Verdict.UNCHANGED, Verdict.FASTER, Verdict.FIXED, Verdict.SLOWER,
                     Verdict.PARITY_DRIFT, Verdict.FUSION_LOST, Verdict.XPASS)


def block_on_deploy(cell: CellComparison, deploy: Mapping[str, str] | None = None) -> None:
    """A candidate file that fails on a release the matrix's ``deploy`` names (and the baseline's
    did not) is a new failure; one that was not tried there cannot be judged (not comparable, and
    the gate cannot tell: ``deploy_problem``); a raised runtime floor is information
    (harness.gate.deploy)."""
    if cell.cand is None:
        return
    if cell.verdict in _CANDIDATE_PASSED and (unchecked := deploy_unchecked(cell.cand, deploy or {})):
        cell.deploy_unchecked = unchecked
        if not cell.verdict.blocking:   # a regression found on the matrix's runtime stays one
            cell.verdict, cell.detail = Verdict.NOT_COMPARABLE, f"deployed runtime not checked: {unchecked}"
        else:
            cell.notes.append(f"deployed runtime not checked: {unchecked}")
    elif cell.verdict in _CANDIDATE_PASSED and (why := deploy_failure(cell.base, cell.cand)):
        cell.verdict, cell.detail = Verdict.NEW_FAILURE, f"deployed runtime: {why}"
    elif note := floor_raised(cell.base, cell.cand):
        cell.notes.append(note)


def deploy_problem(cells: list[CellComparison]) -> str | None:
    """Why the gate cannot tell because deployed releases were not tried (None: every one was)."""
    unchecked = [c for c in cells if c.deploy_unchecked]
    if not unchecked:
        return None
    return (f"the deployed runtime release was not tried on {len(unchecked)} passing cell(s) "
            f"(e.g. {unchecked[0].name}: {unchecked[0].deploy_unchecked})")


# Verdicts of cells that worked on both sides: only there can an interface change be the news.
_WORKED = (Verdict.UNCHANGED, Verdict.FASTER)


def block_on_drift(cell: CellComparison, settings: Settings) -> None:
    """With ``--block-on io``, a cell that works on both sides but whose file changed its input or
    output names or dynamic dims is a regression: deployment code feeds and fetches by name."""
    drift = cell.drift
    if "io" in settings.block_on and drift is not None and drift.io_changed and cell.verdict in _WORKED:
        io = [p for p in drift.parts() if p.startswith(("inputs", "outputs")) or " dims " in p]
        cell.verdict, cell.detail = Verdict.INTERFACE_CHANGE, "; ".join(io)


@dataclass(frozen=True)
class Coverage:
    """How much of the comparison the gate could make.

    Expected: every cell either side planned (a cell of the baseline's run, of the candidate's,
    or of both), less the cells skipped on every side that has them (they run nowhere: a GPU
    cell on a CPU machine). A cell only one side has is expected and not compared: a baseline
    that shares 1 of N cells with the candidate is 1 of N, never "1 of 1". Compared: the
    expected cells with any verdict but "not comparable". A gate that compared nothing, or less
    than ``Settings.min_compared`` of the expected cells, cannot say "no regression". A cell
    whose latency "cannot tell" (timed while the machine was busy) was
    compared for its statuses and parity; only a gate whose every compared cell is one cannot tell."""

    compared: int
    expected: int
    skipped_both: int                 # skipped on every side that has the cell
    why_not: dict[str, int]           # reason → cells of the expected ones not compared
    latency_unknown: int = 0          # compared cells whose latency cannot be told

    @classmethod
    def of(cls, cells: list[CellComparison]) -> "Coverage":
        def skipped(c: CellComparison) -> bool:
            return all(r.status is Status.SKIP for r in (c.base, c.cand) if r is not None)
        expected = [c for c in cells if not skipped(c)]
        missing = [c for c in expected if c.verdict is Verdict.NOT_COMPARABLE]
        why: dict[str, int] = {}
        for c in missing:
            reason = c.detail.split(":", 1)[0] if c.detail else "not comparable"
            why[reason] = why.get(reason, 0) + 1
        unknown = sum(1 for c in expected if c.verdict is Verdict.CANNOT_TELL)
        return cls(len(expected) - len(missing), len(expected), len(cells) - len(expected), why, unknown)

    @property
    def share(self) -> float:
        return self.compared / self.expected if self.expected else 0.0

    def problem(self, min_share: float) -> str | None:
        """Why the gate cannot tell (exit 2), or None when enough cells were compared."""
        if self.compared == 0:
            if not self.expected:
                return ("no cell was comparable: neither side has a cell that ran "
                        f"({self.skipped_both} skipped on both)")
            return f"no cell was comparable: {self.reasons()}"
        if self.latency_unknown and self.latency_unknown == self.compared:
            return (f"no cell was compared in full: the latency of each of the {self.compared} compared "
                    "cells cannot be told (timed while the machine was busy, or not timed again)")
        if self.share + 1e-12 < min_share:
            return (f"only {self.compared} of {self.expected} cells were compared "
                    f"({self.share:.0%}, --min-compared {min_share:.0%}): {self.reasons()}")
        return None

    def reasons(self) -> str:
        missing = self.expected - self.compared
        parts = ", ".join(f"{n} {why}" for why, n in sorted(self.why_not.items(), key=lambda kv: -kv[1]))
        return f"{missing} of {self.expected} not comparable ({parts})" if missing else "all compared"

    def summary(self) -> str:
        extra = f"; {self.skipped_both} skipped on both sides" if self.skipped_both else ""
        if self.latency_unknown:
            extra += f"; the latency of {self.latency_unknown} cannot be told"
        return f"{self.compared} of {self.expected} cells compared{extra}"
