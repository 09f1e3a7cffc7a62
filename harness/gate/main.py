"""Upgrade gate: does bumping torch from a baseline to a candidate break or slow down any cell?

Resolve both sides (stored runs, or a torch version whose missing cells are run now), compare
per cell, re-measure the cells flagged slower once for both sides (a noisy host flags cells that a
second look clears), then write markdown, JUnit XML and JSON. Exit 0: no regression; 1: at
least one; 2: the gate cannot tell: bad arguments or configuration, identical sides, a torch
version the package index does not have (resolved for both sides before anything runs), an
environment that could not be built (raised as ConfigError for the CLI to map; the CLI maps any
other error to 2 as well).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path


from harness.console import console
from harness.core.cell import CellKey
from harness.core.record import Record, read_records
from harness.core.status import Status
from harness.gate.compare import CellComparison, Coverage, Settings, Verdict, compare_sides, deploy_problem
from harness.gate.output import write_outputs
from harness.gate.sources import (
    PendingSide,
    Side,
    check_environments,
    complete_side,
    plan_version_side,
    run_cells,
    run_side_or_none,
    same_side,
    version_plan,
)
from harness.gate.stats import compare_latency
from harness.matrix.config import Matrix, load_matrix
from harness.matrix.rules import ConfigError
from harness.run.annotate import Annotator
from harness.store.provenance import fingerprint



@dataclass
class GateRequest:
    baseline: str
    candidate: str
    config: Path
    reports: Path
    output: Path | None = None
    provider: str = "venv"
    settings: Settings = Settings()
    remeasure: int = 2          # fresh processes per side for cells flagged slower; 0: none


def check_settings(settings: Settings, remeasure: int) -> None:
    if not settings.latency_threshold >= 1.0:
        raise ConfigError(f"--latency-threshold must be >= 1 (got {settings.latency_threshold})")
    if not 0 < settings.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1 (got {settings.alpha})")
    if remeasure < 0:
        raise ConfigError(f"--remeasure must be >= 0 (got {remeasure})")
    if not settings.parity_factor >= 0:
        raise ConfigError(f"--parity-factor must be >= 0 (got {settings.parity_factor})")
    if not 0 <= settings.min_compared <= 1:
        raise ConfigError(f"--min-compared must be between 0 and 1 (got {settings.min_compared})")


def remeasure_side(side: Side, keys: set[CellKey], matrix: Matrix, req: GateRequest, out: Path,
                   current: dict) -> dict[CellKey, Record]:
    """Run the flagged cells again for one side into the gate's directory (not the store)."""
    restricted, plan = version_plan(matrix, side.torch)
    ids = {c.cell_id for c in plan.cells
           if c.key in keys}
    if not ids:
        return {}
    if out.exists():
        shutil.rmtree(out)  # the gate's own scratch run from an earlier gate into the same --output
    run_dir = run_cells(restricted, req.config, plan.restricted(ids), out, req.reports, req.provider, current)
    return {r.key: r for r in read_records(run_dir / "results.jsonl")}


def remeasure(cells: list[CellComparison], base: Side, cand: Side, matrix: Matrix, req: GateRequest,
              out: Path, current: dict) -> None:
    """Re-measure the cells flagged slower in fresh worker processes, baseline and candidate
    interleaved, then re-decide them on the fresh samples."""
    slower = {c.key for c in cells if c.verdict is Verdict.SLOWER}
    if not slower or req.remeasure < 1:
        return
    console.print(f"re-measuring {len(slower)} cell(s) flagged slower: {req.remeasure} process(es) per side")
    fresh_base: dict[CellKey, list[Record]] = {}
    fresh_cand: dict[CellKey, list[Record]] = {}
    for i in range(1, req.remeasure + 1):
        for side, fresh, name in ((base, fresh_base, "baseline"), (cand, fresh_cand, "candidate")):
            for key, rec in remeasure_side(side, slower, matrix, req, out / "remeasure" / f"{name}-{i}",
                                           current).items():
                fresh.setdefault(key, []).append(rec)
    for cell in cells:
        if cell.verdict is Verdict.SLOWER:
            redecide(cell, fresh_base.get(cell.key, []), fresh_cand.get(cell.key, []), req)


def redecide(cell: CellComparison, base: list[Record], cand: list[Record], req: GateRequest) -> None:
    """Slower only if the pooled fresh samples are, and every fresh candidate process is slower
    than every fresh baseline process: latency can settle per process (memory layout, core), and
    one process per side cannot tell that from a regression."""
    base = [r for r in base if r.status is Status.PASS and r.latency_ms.samples]
    cand = [r for r in cand if r.status is Status.PASS and r.latency_ms.samples]
    if len(base) < req.remeasure or len(cand) < req.remeasure:
        cell.notes.append("could not re-measure: counted on the first measurement")
        return
    settings = req.settings
    first = cell.latency
    lat = compare_latency([s for r in base for s in r.latency_ms.samples],
                          [s for r in cand for s in r.latency_ms.samples],
                          settings.latency_threshold, settings.alpha)
    b_meds = [r.latency_ms.median for r in base]
    c_meds = [r.latency_ms.median for r in cand]
    consistent = min(c_meds) > settings.latency_threshold * max(b_meds)
    cell.latency, cell.remeasured = lat, True
    meds = (f"process medians {', '.join(f'{m:.3g}' for m in b_meds)} → "
            f"{', '.join(f'{m:.3g}' for m in c_meds)} ms")
    was = f"first ×{first.ratio:.2f}" if first else "first measurement"
    if lat.slower and consistent:
        cell.detail = f"median ×{lat.ratio:.2f} (p={lat.p_value:.2g}), {meds}; {was}"
    else:
        cell.verdict = Verdict.FASTER if lat.faster else Verdict.UNCHANGED
        cell.detail = f"{was} cleared by re-measurement: ×{lat.ratio:.2f}, {meds}"


def check_installable(pending: dict[str, PendingSide], matrix: Matrix, req: GateRequest) -> None:
    """Resolve the environments of every cell either side still has to run, both sides before
    anything runs: a torch the index does not have is exit 2, never a side of failures."""
    from harness.envs import make_provider
    from harness.envs.resolve import preflight
    from harness.matrix.plan import Plan

    listed = {t.version for t in matrix.torch}
    envs = [e for p in pending.values() for e in p.missing.environments]
    if not envs:
        return
    provider = make_provider(req.provider, log=lambda *a, **k: None)
    # A version the file does not list is named by the option that asked for it.
    keys = {p.side.torch: f"--{which} {p.side.torch}" for which, p in pending.items()
            if p.side.torch not in listed}
    preflight(Plan(matrix, envs), req.config, skip=provider.skip_reason,
              ready=getattr(provider, "is_ready", lambda spec: False), torch_key=keys)


def run_gate(req: GateRequest) -> int:
    """Compare the two sides and write the reports; 0 no regression, 1 regression. Anything
    that keeps the gate from comparing (arguments, config, an environment) raises ConfigError."""
    from harness.envs.existing import probe_matrix

    check_settings(req.settings, req.remeasure)
    matrix = probe_matrix(load_matrix(req.config), req.config)   # existing environments name their release
    current = fingerprint(matrix, req.config)
    out = req.output or req.reports / "gates" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    refs = {"baseline": req.baseline, "candidate": req.candidate}
    runs = {which: run_side_or_none(ref, req.reports) for which, ref in refs.items()}
    if same_side(runs["baseline"], runs["candidate"], req.baseline, req.candidate):
        raise ConfigError(f"--baseline {req.baseline} and --candidate {req.candidate} are the same "
                          "results: expected two different torch versions or runs to compare")
    for which, ref in refs.items():
        if runs[which] is None and not version_plan(matrix, ref)[1].cells:
            raise ConfigError(f"{req.config}: no cells for torch {ref} (check exclude/include)")
    pending = {which: plan_version_side(ref, matrix, req.config, req.reports, current)
               for which, ref in refs.items() if runs[which] is None}
    check_installable(pending, matrix, req)
    sides = {which: runs[which] or complete_side(pending[which], req.config, req.reports, req.provider,
                                                 current) for which in refs}
    check_environments(sides)
    base, cand = sides["baseline"], sides["candidate"]
    cells = compare_sides(base, cand, Annotator(matrix.xfail), req.settings, matrix.deploy)
    remeasure(cells, base, cand, matrix, req, out, current)
    return conclude(cells, base, cand, req.settings, out, current)


def conclude(cells: list[CellComparison], base: Side, cand: Side, settings: Settings, out: Path,
             current: dict) -> int:
    """The gate's exit code, written out with its reports (a torch gate and a package gate alike)."""
    coverage = Coverage.of(cells)
    # A deployed release that was not tried on a passing file: whatever --min-compared allows.
    problem = coverage.problem(settings.min_compared) or deploy_problem(cells)
    # A regression among the compared cells is one whatever else is missing; without one, a gate
    # that compared too little cannot tell (2), never "no regression" (0).
    code = 1 if any(c.verdict.blocking for c in cells) else 2 if problem else 0
    md = write_outputs(out, base, cand, cells, settings, code, current, coverage)
    print(md)
    print(f"gate reports: {out}")
    if problem:
        console.print(f"gate: cannot tell: {problem}", markup=False, highlight=False)
    return code
