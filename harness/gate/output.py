"""Gate reports: markdown (PR comment / step summary), JUnit XML (CI test view), JSON (machines)."""
from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from harness.core.env import ExistingEnv
from harness.core.text import ENCODE_ERRORS
from harness.gate.compare import CellComparison, Coverage, Settings, Verdict, deploy_problem
from harness.gate.sources import Side
from harness.report.text import md_code, md_text

SHOWN = 40   # rows of the package table in gate.md (all of them are in gate.json)
# The packages a reader looks for first; the rest follow in alphabetical order.
FIRST = ("torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "numpy",
         "protobuf", "transformers", "optimum", "optimum-onnx", "torchvision", "timm")
# Characters XML 1.0 does not allow anywhere in a document, escaped or not (NUL, backspace,
# other C0 controls but tab/newline/CR, lone surrogates, U+FFFE/U+FFFF).
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

# Sections in the order a reviewer needs them; unchanged cells are only counted.
SECTIONS = [
    (Verdict.NEW_FAILURE, "New failures"), (Verdict.FAILS_EARLIER, "Failing at an earlier stage"),
    (Verdict.PARITY_DRIFT, "Parity drift"), (Verdict.FUSION_LOST, "Fusions lost (pipeline steps)"),
    (Verdict.INTERFACE_CHANGE, "Input/output changes (`--block-on io`)"),
    (Verdict.SLOWER, "Slower"), (Verdict.CANNOT_TELL, "Latency cannot be told (not blocking)"),
    (Verdict.FIXED, "Fixed"), (Verdict.FASTER, "Faster"),
    (Verdict.XPASS, "Known failures now passing: remove their `xfail` entries"),
    (Verdict.XFAIL, "Known failures (`xfail`, not blocking)"),
    (Verdict.NOT_COMPARABLE, "Not comparable"), (Verdict.STILL_FAILING, "Still failing"),
]


def package_changes(base: ExistingEnv, cand: ExistingEnv) -> list[tuple[str, str, str]]:
    """(package, baseline, candidate) for each package whose version differs, is on one side
    only, or has the same version built from other files; Python first when it differs."""
    before, after = base.versions, cand.versions
    rows = []
    if base.python_version != cand.python_version:
        rows.append(("python", base.python_version, cand.python_version))
    if base.facts.get("cuda") != cand.facts.get("cuda"):
        rows.append(("CUDA (torch's)", str(base.facts.get("cuda") or "none"), str(cand.facts.get("cuda") or "none")))
    order = {name: i for i, name in enumerate(FIRST)}
    for name in sorted(set(before) | set(after), key=lambda n: (order.get(n, len(order)), n)):
        b, c = before.get(name, "—"), after.get(name, "—")
        if b != c:
            rows.append((name, b, c))
        elif base.hashes.get(name) and cand.hashes.get(name) and base.hashes[name] != cand.hashes[name]:
            rows.append((name, f"{b} (files {base.hashes[name][:8]})", f"{c} (files {cand.hashes[name][:8]})"))
    return rows


def packages_markdown(base: Side, cand: Side) -> list[str]:
    """gate.md's first section for two environments: the packages that differ between them."""
    if base.environment is None or cand.environment is None:
        return []
    rows = package_changes(base.environment, cand.environment)
    lines = ["", f"### Packages that differ ({len(rows)})", "",
             f"Baseline {md_code(base.environment.where)}, candidate {md_code(cand.environment.where)}."]
    if not rows:
        return lines + ["", "Same package versions on both sides."]
    lines += ["", "| package | baseline | candidate |", "|---|---|---|"]
    lines += [f"| {md_text(n)} | {md_text(b)} | {md_text(c)} |" for n, b, c in rows[:SHOWN]]
    if len(rows) > SHOWN:
        lines.append(f"\n{len(rows) - SHOWN} more in gate.json (`packages_differ`).")
    return lines


def _state(rec: Any, median: float | None = None) -> str:
    """Status and median; ``median`` overrides the record's when the verdict rests on an interleaved timing."""
    if rec is None:
        return "—"
    median = median if median is not None else rec.latency_ms.median
    if rec.status.passed and median is not None:
        return f"{rec.status} {median:.3g} ms"
    return f"{rec.status} ({rec.stage})" if rec.stage else rec.status


def blame_text(c: CellComparison) -> str | None:
    """Whose bug a failing candidate cell is ('blame: runtime-kernel (openvinotoolkit/openvino): ...')."""
    blame = c.cand.blame if c.cand is not None and not c.cand.status.passed else None
    if blame is None:
        return None
    repo = f" ({blame.repository})" if blame.repository else ""
    layer = f" · {blame.layer}, {blame.kind}" if blame.layer else ""
    moved = f"; {c.layer_change}" if c.layer_change else ""
    return f"blame: {blame.party}{repo}{layer}: {blame.reason}{moved}"


def fixed_text(c: CellComparison, candidate: str) -> str | None:
    """A fixed cell whose baseline failure had a blamed layer: 'fixed in onnxscript 0.7.2: the
    baseline's failure was translation: onnxscript (microsoft/onnxscript)' (the remedy a
    companion bump was seen to be)."""
    blame = c.base.blame if c.base is not None and c.base.status.is_failure else None
    if c.verdict is not Verdict.FIXED or blame is None or not blame.layer:
        return None
    return f"fixed in {candidate}: the baseline's failure was {blame.layer} ({blame.repository or 'model owner'})"


def _cell(text: str, limit: int = 140) -> str:
    return md_text(text, limit)


def xml_text(value: Any) -> str:
    """Text that keeps an XML document well-formed: characters XML cannot carry become
    ``\\xNN`` / ``\\uNNNN`` (ElementTree escapes ``<``, ``&`` and quotes itself)."""
    text = "" if value is None else str(value)
    return _XML_INVALID.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                       else f"\\u{ord(m.group()):04x}"), text)


def ratio_text(c: CellComparison) -> str:
    """The ratio column: the interleaved ratio with its interval, else the first look's."""
    lat = c.latency
    if lat is None:
        return "n/a"
    if lat.ratio_interval:
        return f"{lat.ratio:.2f} ({lat.ratio_interval[0]:.2f}–{lat.ratio_interval[1]:.2f})"
    return f"{lat.ratio:.2f}"


def latency_rule(settings: Settings, remeasure: int) -> str:
    """The footer's sentence on how latency is decided."""
    if remeasure < 1:
        return (f"Latency counts when the median ratio > {settings.latency_threshold:g} and Mann–Whitney p < "
                f"{settings.alpha:g} (or the medians' intervals do not overlap) on the stored figures "
                "(`--remeasure 0`: not timed again)")
    return (f"Latency: cells whose stored medians differ by more than ×{settings.latency_threshold ** 0.5:.3g} "
            f"(or were timed on a loaded machine) are exported again and timed interleaved, both files "
            f"alternated in random order in short rounds in at least {remeasure} fresh process sets; slower "
            f"only when the whole {settings.confidence:.0%} interval of the paired ratio lies above "
            f"{settings.latency_threshold:g}")


def render_markdown(base: Side, cand: Side, cells: list[CellComparison], settings: Settings,
                    coverage: Coverage | None = None, remeasure: int = 4) -> str:
    regressions = [c for c in cells if c.verdict.blocking]
    counts = {v: sum(1 for c in cells if c.verdict is v) for v in Verdict}
    coverage = coverage or Coverage.of(cells)
    problem = coverage.problem(settings.min_compared) or deploy_problem(cells)
    head = (f"❌ {len(regressions)} regression{'s' if len(regressions) != 1 else ''}" if regressions
            else f"⚠️ cannot tell: {md_text(problem)}" if problem else "✅ no regression")
    if not problem and coverage.latency_unknown:
        head += f" (⚠️ the latency of {coverage.latency_unknown} cell(s) cannot be told)"
    moved = (f"{md_text(base.title)} → {md_text(cand.title)}" if base.subject
             else f"torch {md_text(base.torch)} → {md_text(cand.torch)}")
    lines = [f"## Upgrade gate: {moved}: {head}", *packages_markdown(base, cand), ""]
    lines.append(", ".join(f"{n} {v.value}" for v, n in counts.items() if n) + f" ({len(cells)} cells)")
    lines += ["", f"**{coverage.summary()}**" + (f" ({md_text(problem)})" if problem and regressions else "")]
    loaded = [c for c in cells if c.latency is not None and c.latency.loaded and not c.remeasured]
    if loaded:
        sides = sorted({side for c in loaded for side in c.latency.loaded})
        lines += ["", f"**Latency not compared for {len(loaded)} cell(s)**: timed on a loaded machine on the "
                  f"{' and the '.join(sides)}; the gate calls nothing slower from such figures (re-run on a "
                  "quiet machine to compare them)."]
    cleared = [(None, "Timed interleaved: no change shown (the stored figures had suggested one)")]
    for verdict, title in SECTIONS + cleared:
        chosen = [c for c in cells if c.verdict is verdict or
                  (verdict is None and c.remeasured and c.verdict is Verdict.UNCHANGED)]
        if not chosen:
            continue
        lines += ["", f"### {title}", "", "| change | cell | before | after | ratio | detail |",
                  "|---|---|---|---|---|---|"]
        for c in chosen:
            ratio = ratio_text(c)
            detail = c.detail
            if c.notes:
                detail += "; " + "; ".join(c.notes)
            blame = blame_text(c)
            if blame:
                detail += f"; {blame}"
            elif (fixed := fixed_text(c, cand.title)):
                detail += f"; {fixed}"
            before = _state(c.base, c.latency.base_median if c.latency else None)
            after = _state(c.cand, c.latency.cand_median if c.latency else None)
            lines.append(f"| {c.verdict.mark or ' '} | {_cell(c.name)} | {_cell(before)} | "
                         f"{_cell(after)} | {ratio} | {_cell(detail, 400 if blame or c.remeasured else 140)} |")
    lines += drift_lines(cells)
    lines += ["", f"Baseline {md_code(base.label)} (runs {md_text(', '.join(base.runs)) or 'none'}), "
              f"candidate {md_code(cand.label)} (runs {md_text(', '.join(cand.runs)) or 'none'}). "
              f"{latency_rule(settings, remeasure)}; parity drift when max_abs grows by more than "
              f"{settings.parity_factor:g}×atol."]
    unrecorded = sorted({run for s in (base, cand) for run, fp in s.fingerprints.items() if not fp})
    if unrecorded:
        lines += ["", f"Runs {md_text(', '.join(unrecorded))} did not record their case source and harness "
                  "code: assumed unchanged."]
    return "\n".join(lines) + "\n"


def drift_lines(cells: list[CellComparison]) -> list[str]:
    """Graph changes per export (runtimes share the file), information unless --block-on made
    them a verdict; nothing when no cell has the graph facts on both sides."""
    with_facts = [c for c in cells if c.drift is not None]
    if not with_facts:
        return []
    rows: dict[tuple, tuple[CellComparison, str]] = {}
    for c in with_facts:
        if c.drift.changed:
            k = c.key
            rows.setdefault((k.case, k.exporter, k.opset, k.options.label), (c, c.drift.summary()))
    lines = ["", "### Graph changes (information)", ""]
    if not rows:
        return lines + [f"The exported files are the same on both sides ({len(with_facts)} cells compared)."]
    lines += ["| export | changes |", "|---|---|"]
    for (case, exporter, opset, label), (c, summary) in sorted(rows.items(), key=lambda kv: tuple(map(str, kv[0]))):
        name = f"{case} · {exporter} · op{opset}" + (f" · {label}" if label else "")
        lines.append(f"| {_cell(name)} | {_cell(summary, 400)} |")
    return lines


def render_junit(base: Side, cand: Side, cells: list[CellComparison]) -> str:
    suite = ET.Element("testsuite", name=xml_text(f"upgrade-gate {base.title} -> {cand.title}" if base.subject
                                            else f"upgrade-gate torch {base.torch} -> {cand.torch}"),
                       tests=str(len(cells)),
                       failures=str(sum(c.verdict.blocking for c in cells)),
                       skipped=str(sum(c.verdict in (Verdict.NOT_COMPARABLE, Verdict.CANNOT_TELL) for c in cells)))
    for c in cells:
        case, exporter, opset, runtime, label = c.key.as_tuple()
        name = f"{exporter}-op{opset}-{runtime}" + (f"-{label}" if label else "")
        tc = ET.SubElement(suite, "testcase", classname=xml_text(f"gate.{case}"), name=xml_text(name))
        message = xml_text(f"{c.verdict.value}: {c.detail}".strip(": "))
        if c.verdict.blocking:
            failure = ET.SubElement(tc, "failure", message=message, type=c.verdict.value)
            failure.text = "\n".join(filter(None, [message, xml_text(blame_text(c)),
                                                    xml_text(c.cand.repro) if c.cand else None]))
        elif c.verdict in (Verdict.NOT_COMPARABLE, Verdict.CANNOT_TELL):
            ET.SubElement(tc, "skipped", message=message)
        elif c.verdict is not Verdict.UNCHANGED:
            ET.SubElement(tc, "system-out").text = message
        elif c.drift is not None and c.drift.changed:
            ET.SubElement(tc, "system-out").text = f"graph changes: {c.drift.summary()}"
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def render_json(base: Side, cand: Side, cells: list[CellComparison], settings: Settings,
                exit_code: int, current: dict[str, Any], coverage: Coverage | None = None,
                remeasure: int = 4) -> str:
    def side(s: Side) -> dict[str, Any]:
        return {"ref": s.label, "torch": s.torch, "runs": s.runs, "executed": s.executed,
                "fingerprints": s.fingerprints, **({"subject": s.subject} if s.subject else {}),
                **({"not_reused": [r.to_dict() for r in s.refused]} if s.refused else {}),
                **({"environment": {**s.environment.to_dict(), "installed": list(s.environment.installed)}}
                   if s.environment is not None else {})}

    data = {
        "schema": 1, "baseline": side(base), "candidate": side(cand),
        "settings": {"latency_threshold": settings.latency_threshold, "alpha": settings.alpha,
                     "parity_factor": settings.parity_factor, "block_on": list(settings.block_on),
                     "confidence": settings.confidence, "remeasure": remeasure},
        "fingerprint": current, "exit_code": exit_code,
        "coverage": _coverage_dict(coverage or Coverage.of(cells), settings),
        "counts": {v.value: sum(1 for c in cells if c.verdict is v) for v in Verdict},
        "cells": [c.to_dict() for c in cells],
    }
    if base.environment is not None and cand.environment is not None:
        data["packages_differ"] = [{"package": n, "baseline": b, "candidate": c}
                                   for n, b, c in package_changes(base.environment, cand.environment)]
    return json.dumps(data, indent=2, default=str) + "\n"


def _coverage_dict(coverage: Coverage, settings: Settings) -> dict[str, Any]:
    return {"compared": coverage.compared, "expected": coverage.expected,
            "skipped_both": coverage.skipped_both, "not_compared": coverage.why_not,
            "latency_unknown": coverage.latency_unknown,
            "min_compared": settings.min_compared, "problem": coverage.problem(settings.min_compared)}


def write_outputs(out: Path, base: Side, cand: Side, cells: list[CellComparison],
                  settings: Settings, exit_code: int, current: dict[str, Any],
                  coverage: Coverage | None = None, remeasure: int = 4) -> str:
    out.mkdir(parents=True, exist_ok=True)
    coverage = coverage or Coverage.of(cells)
    md = render_markdown(base, cand, cells, settings, coverage, remeasure)
    (out / "gate.md").write_text(md, encoding="utf-8", errors=ENCODE_ERRORS)
    (out / "junit.xml").write_text(render_junit(base, cand, cells), encoding="utf-8", errors=ENCODE_ERRORS)
    (out / "gate.json").write_text(render_json(base, cand, cells, settings, exit_code, current, coverage, remeasure),
                                   encoding="utf-8", errors=ENCODE_ERRORS)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8", errors=ENCODE_ERRORS) as fh:
            fh.write(md)
    return md
