"""Verdict per cell (case, exporter, opset, runtime, options) between baseline and candidate.

Classes follow asv compare: a new failure, a parity drift beyond the case's budget or a slower
median that is also statistically significant is a regression (blocks); fixed, faster, known
failure (xfail), known failure now passing (xpass), still failing, not comparable and unchanged
are reported but never block.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from harness.annotate import Annotator
from harness.gate_sources import Side, same_code
from harness.records import Record, Status, option_label
from harness.stats import DEFAULT_ALPHA, DEFAULT_RATIO, LatencyChange, compare_latency

# A candidate may use this share of the case's atol more than the baseline did before it counts.
DEFAULT_PARITY_FACTOR = 0.5


class Verdict(str, enum.Enum):
    NEW_FAILURE = "new failure"
    PARITY_DRIFT = "parity drift"
    SLOWER = "slower"
    FIXED = "fixed"
    FASTER = "faster"
    XFAIL = "known failure"
    XPASS = "known failure now passing"
    STILL_FAILING = "still failing"
    NOT_COMPARABLE = "not comparable"
    UNCHANGED = "unchanged"

    @property
    def blocking(self) -> bool:
        return self in (Verdict.NEW_FAILURE, Verdict.PARITY_DRIFT, Verdict.SLOWER)

    @property
    def mark(self) -> str:
        """asv compare's change column: ! failed, + worse, - better, x not comparable."""
        return {Verdict.NEW_FAILURE: "!", Verdict.PARITY_DRIFT: "+", Verdict.SLOWER: "+",
                Verdict.FIXED: "-", Verdict.FASTER: "-", Verdict.NOT_COMPARABLE: "x",
                Verdict.XPASS: "?"}.get(self, " ")


@dataclass(frozen=True)
class Settings:
    latency_threshold: float = DEFAULT_RATIO
    alpha: float = DEFAULT_ALPHA
    parity_factor: float = DEFAULT_PARITY_FACTOR


@dataclass
class CellComparison:
    key: tuple
    verdict: Verdict
    base: Record | None
    cand: Record | None
    detail: str = ""
    latency: LatencyChange | None = None
    remeasured: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        case, exporter, opset, runtime, label = self.key
        return f"{case} · {exporter} · op{opset} · {runtime}" + (f" · {label}" if label else "")

    def to_dict(self) -> dict[str, Any]:
        case, exporter, opset, runtime, label = self.key
        lat = self.latency
        return {
            "case": case, "exporter": exporter, "opset": opset, "runtime": runtime, "options": label,
            "verdict": self.verdict.value, "blocking": self.verdict.blocking, "detail": self.detail,
            "baseline": _side_dict(self.base), "candidate": _side_dict(self.cand),
            "latency": None if lat is None else {"ratio": lat.ratio, "p_value": lat.p_value,
                                                 "base_median": lat.base_median,
                                                 "cand_median": lat.cand_median},
            "remeasured": self.remeasured, "notes": self.notes,
        }


def _side_dict(rec: Record | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {"run_id": rec.run_id, "cell_id": rec.cell_id, "torch": rec.torch, "status": rec.status,
            "stage": rec.stage, "error": rec.error, "reason": rec.reason,
            "max_abs": rec.parity.get("max_abs"), "atol": rec.parity.get("atol"),
            "latency_median_ms": rec.latency_ms.get("median")}


def reannotate(rec: Record, annotate: Annotator) -> Record:
    """Apply the gate config's known failures, not the ones in force when the run was made."""
    raw = {Status.XFAIL.value: Status.FAIL.value, Status.XPASS.value: Status.PASS.value}
    rec = replace(rec, status=raw.get(rec.status, rec.status),
                  reason=None if rec.status in raw else rec.reason)
    return annotate(rec)


def _failed(rec: Record) -> bool:
    return Status(rec.status).is_failure


def compare_statuses(base: Record, cand: Record) -> tuple[Verdict, str] | None:
    """The verdict decided by statuses alone, or None when both passed."""
    where = lambda r: f"{r.status} at {r.stage}" if r.stage else r.status  # noqa: E731
    if Status.SKIP.value in (base.status, cand.status):
        side = "baseline" if base.status == Status.SKIP.value else "candidate"
        rec = base if side == "baseline" else cand
        return Verdict.NOT_COMPARABLE, f"skipped on {side}: {rec.reason or rec.error or ''}".strip()
    if cand.status == Status.XPASS.value:
        return Verdict.XPASS, cand.reason or ""
    if cand.status == Status.XFAIL.value:
        return Verdict.XFAIL, cand.reason or ""
    base_bad = _failed(base) or base.status == Status.XFAIL.value
    if base_bad and _failed(cand):
        stages = f"{base.stage} → {cand.stage}" if base.stage != cand.stage else str(cand.stage)
        return Verdict.STILL_FAILING, stages
    if base_bad:
        return Verdict.FIXED, f"was {where(base)}"
    if _failed(cand):
        return Verdict.NEW_FAILURE, f"{where(cand)}: {cand.error or ''}".strip()
    return None


def compare_parity(base: Record, cand: Record, factor: float) -> str | None:
    """Why the candidate's worst error drifted beyond its budget, or None."""
    b, c = base.parity.get("max_abs"), cand.parity.get("max_abs")
    atol = cand.parity.get("atol") or base.parity.get("atol")
    if b is None or c is None or not atol:
        return None
    budget = factor * atol
    if c - b > budget:
        return f"max_abs {b:.3g} → {c:.3g} (+{c - b:.3g} > {factor:g}×atol = {budget:.3g})"
    return None


def compare_timing(base: Record, cand: Record, settings: Settings) -> LatencyChange | None:
    bs, cs = base.latency_ms.get("samples") or [], cand.latency_ms.get("samples") or []
    if not bs or not cs or base.latency_ms.get("threads") != cand.latency_ms.get("threads"):
        return None
    return compare_latency(bs, cs, settings.latency_threshold, settings.alpha)


def compare_cell(key: tuple, base: Record | None, cand: Record | None, settings: Settings,
                 code_match: bool | None) -> CellComparison:
    if base is None or cand is None:
        where = "baseline" if base is None else "candidate"
        return CellComparison(key, Verdict.NOT_COMPARABLE, base, cand, f"no result on {where}")
    if code_match is False:
        return CellComparison(key, Verdict.NOT_COMPARABLE, base, cand,
                              "case source or harness code differs between the two runs")
    notes: list[str] = []  # runs without a fingerprint are named once, in the report footer
    decided = compare_statuses(base, cand)
    if decided is not None:
        return CellComparison(key, decided[0], base, cand, decided[1], notes=notes)
    drift = compare_parity(base, cand, settings.parity_factor)
    lat = compare_timing(base, cand, settings)
    if drift:
        return CellComparison(key, Verdict.PARITY_DRIFT, base, cand, drift, lat, notes=notes)
    if lat is not None and lat.significant:
        verdict = Verdict.SLOWER if lat.slower else Verdict.FASTER
        return CellComparison(key, verdict, base, cand, f"median ×{lat.ratio:.2f} (p={lat.p_value:.2g})",
                              lat, notes=notes)
    return CellComparison(key, Verdict.UNCHANGED, base, cand, "", lat, notes=notes)


def compare_sides(base: Side, cand: Side, annotate: Annotator, settings: Settings) -> list[CellComparison]:
    """One comparison per cell key present on either side, in a stable order."""
    by_base = {r.key: reannotate(r, annotate) for r in base.records}
    by_cand = {r.key: reannotate(r, annotate) for r in cand.records}
    out = []
    for key in sorted(set(by_base) | set(by_cand), key=lambda k: tuple(map(str, k))):
        b, c = by_base.get(key), by_cand.get(key)
        match = None
        if b is not None and c is not None:
            match = same_code(base.fingerprints.get(b.run_id), cand.fingerprints.get(c.run_id), key[0])
        out.append(compare_cell(key, b, c, settings, match))
    return out


def cell_key(case: str, exporter: str, opset: int, runtime: str, options: dict[str, Any]) -> tuple:
    return (case, exporter, opset, runtime, option_label(options))
