"""Upgrade gate: does bumping torch from a baseline to a candidate break or slow down any cell?

Resolve both sides (stored runs, or a torch version whose missing cells are run now), compare
per cell, re-measure the cells flagged slower once for both sides (a noisy host flags cells that a
second look clears), then write markdown, JUnit XML and JSON. Exit 0: no regression; 1: at
least one; 2: bad arguments or configuration (raised as ConfigError for the CLI to map).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from harness.annotate import Annotator
from harness.config import ConfigError, Matrix, load_matrix
from harness.gate_compare import (CellComparison, Settings, Verdict, cell_key, compare_sides,
                                  compare_timing)
from harness.gate_output import write_outputs
from harness.gate_sources import (Side, fingerprint, prune, run_cells, run_side_or_none,
                                  side_from_version, version_plan)
from harness.records import Record, read_records

console = Console(stderr=True)


@dataclass
class GateRequest:
    baseline: str
    candidate: str
    config: Path
    reports: Path
    output: Path | None = None
    provider: str = "venv"
    settings: Settings = Settings()
    remeasure: bool = True


def check_settings(settings: Settings) -> None:
    if not settings.latency_threshold >= 1.0:
        raise ConfigError(f"--latency-threshold must be >= 1 (got {settings.latency_threshold})")
    if not 0 < settings.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1 (got {settings.alpha})")
    if not settings.parity_factor >= 0:
        raise ConfigError(f"--parity-factor must be >= 0 (got {settings.parity_factor})")


def remeasure_side(side: Side, keys: set[tuple], matrix: Matrix, req: GateRequest, out: Path,
                   current: dict) -> dict[tuple, Record]:
    """Run the flagged cells again for one side into the gate's directory (not the store)."""
    restricted, plan = version_plan(matrix, side.torch)
    ids = {c.cell_id for c in plan.cells
           if cell_key(c.case, c.exporter, c.opset, c.runtime, c.options) in keys}
    if not ids:
        return {}
    if out.exists():
        shutil.rmtree(out)  # the gate's own scratch run from an earlier gate into the same --output
    run_dir = run_cells(restricted, req.config, prune(plan, ids), out, req.reports, req.provider, current)
    return {r.key: r for r in read_records(run_dir / "results.jsonl")}


def apply_remeasure(cells: list[CellComparison], base: dict[tuple, Record], cand: dict[tuple, Record],
                    settings: Settings) -> None:
    """Replace each slower verdict by the verdict on the fresh samples of both sides."""
    for cell in cells:
        if cell.verdict is not Verdict.SLOWER:
            continue
        b, c = base.get(cell.key), cand.get(cell.key)
        if b is None or c is None or b.status != "pass" or c.status != "pass":
            cell.notes.append("could not re-measure: counted on the first measurement")
            continue
        first = cell.latency
        lat = compare_timing(b, c, settings)
        cell.remeasured = True
        if lat is None:
            cell.notes.append("re-measurement has no comparable samples: counted on the first one")
            continue
        # Show the numbers the verdict rests on; the first measurement stays in the detail.
        cell.latency, cell.base, cell.cand = lat, b, c
        was = f"first ×{first.ratio:.2f}" if first else ""
        if lat.slower:
            cell.detail = f"median ×{lat.ratio:.2f} (p={lat.p_value:.2g}); {was}"
        else:
            cell.verdict = Verdict.FASTER if lat.faster else Verdict.UNCHANGED
            cell.detail = f"{was}, cleared by re-measurement (×{lat.ratio:.2f})"


def run_gate(req: GateRequest) -> int:
    check_settings(req.settings)
    matrix = load_matrix(req.config)
    current = fingerprint(matrix, req.config)
    out = req.output or req.reports / "gates" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    runs = [run_side_or_none(ref, req.reports) for ref in (req.baseline, req.candidate)]
    for ref, side in zip((req.baseline, req.candidate), runs):
        if side is None and not version_plan(matrix, ref)[1].cells:
            raise ConfigError(f"{req.config}: no cells for torch {ref} (check exclude/include)")
    base, cand = (side or side_from_version(ref, matrix, req.config, req.reports, req.provider, current)
                  for ref, side in zip((req.baseline, req.candidate), runs))
    cells = compare_sides(base, cand, Annotator(matrix.xfail), req.settings)
    slower = {c.key for c in cells if c.verdict is Verdict.SLOWER}
    if slower and req.remeasure:
        console.print(f"re-measuring {len(slower)} cell(s) flagged slower, for both sides")
        fresh_base = remeasure_side(base, slower, matrix, req, out / "remeasure" / "baseline", current)
        fresh_cand = remeasure_side(cand, slower, matrix, req, out / "remeasure" / "candidate", current)
        apply_remeasure(cells, fresh_base, fresh_cand, req.settings)
    code = 1 if any(c.verdict.blocking for c in cells) else 0
    md = write_outputs(out, base, cand, cells, req.settings, code, current)
    print(md)
    print(f"gate reports: {out}")
    return code
