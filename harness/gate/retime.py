"""Latency verdicts from interleaved A/B timing (``harness.run.ab``), and what is slower.

The stored records (the first look, ``compare.compare_timing``) only choose the cells to time:
two medians measured minutes apart in two processes are no evidence when a process's timing
settles into one of several modes. A cell is chosen when both sides passed and its stored ratio
is beyond ``√threshold`` either way, or either side was timed on a loaded machine or split into
modes. Its two files are exported again into the gate's directory (kept in the run's spool), and
timed interleaved: both files loaded in each fresh process of one runtime stack, alternated in a
random order each round; where the two sides' runtime releases differ, a process of each stack
alternates with the other round by round, each loading both files, so that the candidate's file
is also timed in the baseline's stack and the baseline's file in the candidate's.

The verdict comes from the paired per-round ratios (``stats.analyse``): slower only when the whole
interval of the ratio lies above the threshold, faster only when it lies below its inverse; a
comparison with too few rounds in which the timing process had its core is "cannot tell". A
slower cell says what is slower: the file (with its graph drift), the runtime stack (with the
releases that differ), or both.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.console import console
from harness.core.cell import CellKey
from harness.core.env import EnvSpec
from harness.core.record import Record, read_records
from harness.envs.provider import harness_process_env
from harness.envs.runtime_only import RuntimeOnlyEnvs, RuntimeRelease
from harness.gate.compare import CellComparison, Verdict
from harness.gate.sources import Side, run_cells, version_plan
from harness.gate.stats import Interleaved, LatencyChange, analyse, decisive
from harness.matrix.config import Matrix
from harness.report.drift import cell_drift
from harness.run.ab import ABSettings, Stack, TimedFile, time_interleaved
from harness.runtimes import RUNTIMES


@dataclass
class SideSource:
    """One side of the gate and the matrix its cells are planned from."""

    which: str          # "baseline" or "candidate"
    side: Side
    matrix: Matrix


@dataclass
class Exported:
    """A cell exported again for timing: its record, its file and what runs it."""

    record: Record | None
    file: TimedFile
    env: EnvSpec
    runtime: str        # the registry name ("ort-cpu")


def noticeable(threshold: float) -> float:
    """√threshold, half the threshold's step on a log scale: a slowdown below it is not timed again
    (``suspect``), nor is a part named slower for it (``attribute``)."""
    return math.sqrt(threshold)


def suspect(cell: CellComparison, threshold: float) -> bool:
    """Whether the stored figures leave room for a change the interleaved timing must settle."""
    lat, b, c = cell.latency, cell.base, cell.cand
    if lat is None or b is None or c is None or not (b.status.passed and c.status.passed):
        return False
    split = bool(b.latency_ms.bimodal or c.latency_ms.bimodal)
    return (lat.ratio > noticeable(threshold) or lat.ratio * threshold < 1 or bool(lat.loaded)
            or (split and lat.ratio > 1))


def settings_for(req: Any, matrix: Matrix) -> ABSettings:
    """``--remeasure N``: at least N process sets (and 2), at most max(12, 3N)."""
    n = max(2, req.remeasure)
    return ABSettings(min_processes=n, max_processes=max(12, 3 * n), threads=matrix.threads or 1)


def export_again(src: SideSource, keys: set[CellKey], req: Any, out: Path, current: dict) -> dict[CellKey, Exported]:
    """Run the chosen cells of one side again (verdicts only, files kept) into ``out``."""
    lat = src.matrix.latency
    quiet = src.matrix.model_copy(update={"latency": replace(lat, enabled=False)})
    restricted, plan = version_plan(quiet, src.side.torch)
    plan = plan.restricted({c.cell_id for c in plan.cells if c.key in keys})
    if not plan.cells:
        return {}
    if out.exists():
        shutil.rmtree(out)   # the gate's own scratch run from an earlier gate into the same --output
    run_dir = run_cells(restricted, req.config, plan, out, req.reports, req.provider, current, keep_spool=True)
    records = {r.key: r for r in read_records(run_dir / "results.jsonl")}
    found = {}
    for env_plan in plan.environments:
        for group in env_plan.groups():
            for cell in group.cells:
                key = group.key(cell)
                file = TimedFile(run_dir / "spool" / group.gid, group.options.precision, dict(cell.runtime_options))
                found[key] = Exported(records.get(key), file, env_plan.env, cell.runtime_name)
    return found


def stack_of(ex: Exported, envs: RuntimeOnlyEnvs, provider: str, threads: int) -> Stack | str:
    """Where this side's file runs: a runtime-only environment of the runtime release its cell
    ran (numpy, onnx, the runtime: nothing else), else the cell's own environment; or why not."""
    info = RUNTIMES[ex.runtime]
    version = (ex.record.versions.get(info.package) if ex.record else None) or None
    label = f"{info.package} {version or '?'}"
    env = harness_process_env(threads)
    env.pop("VIRTUAL_ENV", None)
    why = f"no {info.package} release recorded"
    existing = ex.env.existing
    if existing is not None and existing.image is None:
        # An interpreter used as it is: its own runtime is the stack (offline, nothing installed;
        # bytecode kept outside it, as its workers do).
        from harness.envs.existing import pycache_dir

        env.update(PYTHONNOUSERSITE="1", PYTHONPYCACHEPREFIX=str(pycache_dir()))
        return Stack(label, existing.python, ex.runtime, env)
    if version and info.registry == "pypi":
        made = envs.get(RuntimeRelease(ex.runtime, str(version)))
        if made.error is None:
            return Stack(label, made.python, ex.runtime, env)
        why = f"runtime-only environment of {label}: {made.error}"
    if provider == "venv":
        from harness.envs.venv import VenvProvider

        python = VenvProvider(log=lambda *a, **k: None).python(ex.env)
        if python.exists():
            return Stack(label, str(python), ex.runtime, env)
    return why


def retime(cells: list[CellComparison], sources: list[SideSource], req: Any, out: Path, current: dict) -> None:
    """Re-decide the chosen cells' latency from interleaved timing (``--remeasure 0``: never)."""
    threshold = req.settings.latency_threshold
    chosen = [c for c in cells if suspect(c, threshold)]
    if not chosen or req.remeasure < 1:
        return
    console.print(f"timing {len(chosen)} cell(s) interleaved: files exported again, both sides alternated")
    keys = {c.key for c in chosen}
    exported: dict[str, dict[CellKey, Exported]] = {}
    failed: dict[str, str] = {}
    for s in sources:
        try:
            exported[s.which] = export_again(s, keys, req, out / "retime" / s.which, current)
        except Exception as exc:  # noqa: BLE001 - its cells' latency cannot be told; the gate goes on
            exported[s.which], failed[s.which] = {}, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    matrix = sources[0].matrix
    envs = RuntimeOnlyEnvs(install=matrix.install)
    ab = settings_for(req, matrix)
    try:
        for cell in chosen:
            base, cand = exported["baseline"].get(cell.key), exported["candidate"].get(cell.key)
            decide(cell, base, cand, envs, req, ab, failed)
    finally:
        for s in sources:
            shutil.rmtree(out / "retime" / s.which / "spool", ignore_errors=True)


def decide(cell: CellComparison, base: Exported | None, cand: Exported | None, envs: RuntimeOnlyEnvs,
           req: Any, ab: ABSettings, failed: dict[str, str] | None = None) -> None:
    """Time one cell's two files interleaved (``timed``), or say why its latency cannot be told."""
    cell.remeasured = True
    for which, ex in (("baseline", base), ("candidate", cand)):
        if ex is None or ex.record is None or not ex.record.status.passed or not (ex.file.spool / "spool.json").exists():
            if ex is None or ex.record is None:
                why = (failed or {}).get(which, "not run again")
            elif ex.record.status.passed:
                why = "its exported file was not kept"
            else:
                why = f"{ex.record.status} at {ex.record.stage}: {ex.record.error or ''}".strip(": ")
            return cannot_tell(cell, f"the {which}'s file could not be made again ({why})")
    stacks = [stack_of(base, envs, req.provider, ab.threads), stack_of(cand, envs, req.provider, ab.threads)]
    if errors := [s for s in stacks if isinstance(s, str)]:
        return cannot_tell(cell, f"no interpreter to time it in: {errors[0]}")
    if stacks[0].label == stacks[1].label:      # one runtime release: both files in each process
        stacks = stacks[:1]
    timed(cell, [base.file, cand.file], stacks, (base.record, cand.record), req.settings, ab)


def timed(cell: CellComparison, files: list[TimedFile], stacks: list[Stack],
          records: tuple[Record | None, Record | None], settings: Any, ab: ABSettings) -> None:
    """Time the baseline's and the candidate's file (in that order) interleaved, in one stack or
    in each side's (baseline's first), and set the cell's verdict, detail, facts and notes."""
    threshold, confidence = settings.latency_threshold, settings.confidence
    first, flagged = cell.latency, cell.verdict in (Verdict.SLOWER, Verdict.FASTER)
    cell.remeasured = True
    if first is not None and first.load_note in cell.notes:
        cell.notes.remove(first.load_note)     # the first look's figure is not what decides now
    run = time_interleaved(files, stacks, ab, decided=lambda r: decisive(analyse(r, confidence), threshold))
    iv = cell.interleaved = analyse(run, confidence)
    if iv.error is not None:
        return cannot_tell(cell, f"the interleaved timing failed: {iv.error}")
    if iv.main is None:
        return cannot_tell(cell, f"the machine was busy: {iv.busy_text()}")
    m = iv.main
    slower, faster = m.low > threshold, m.high * threshold < 1
    cell.latency = LatencyChange(iv.base_ms or 0.0, iv.cand_ms or 0.0, m.ratio, None, slower, faster,
                                 method="interleaved", ratio_interval=(m.low, m.high))
    sets = f"{iv.sets} process sets" + (f" ({m.n} usable)" if m.n != iv.sets else "")
    how = f"{m.text()}, interleaved in {sets}, {iv.clean} rounds"
    was = f"first look ×{first.ratio:.2f}" if first is not None else "first look"
    if slower:
        cell.verdict = Verdict.SLOWER
        cell.attribution, why = attribute(cell, iv, *records, threshold=threshold)
        cell.detail = f"{how}; {why}; {was}"
    elif faster:
        cell.verdict, cell.detail = Verdict.FASTER, f"{how}; {was}"
    else:
        cell.verdict = Verdict.UNCHANGED
        within = m.low > 1 or m.high < 1          # a change, but inside the threshold
        cell.detail = (f"{how}: within the {threshold:g} threshold; {was}" if within
                       else f"{'not reproducible' if flagged else 'no change'}: {was}; {how}")
    for side, two in iv.modes.items():
        cell.notes.append(f"bimodal across processes on the {side}: {two.text()}")


def cannot_tell(cell: CellComparison, why: str) -> None:
    first = f" (first look ×{cell.latency.ratio:.2f})" if cell.latency is not None else ""
    cell.verdict, cell.detail = Verdict.CANNOT_TELL, f"latency cannot be told{first}: {why}"
    if cell.latency is not None:
        cell.latency = replace(cell.latency, slower=False, faster=False)


def attribute(cell: CellComparison, iv: Interleaved, base: Record | None, cand: Record | None,
              threshold: float) -> tuple[str, str]:
    """What is slower: ("file" | "stack" | "both" | "neither", the sentence). A part counts as
    slower only where its whole interval lies above √threshold, the bar below which the gate does
    not time a cell again: two processes of one runtime differ by a percent or two, which a tight
    interval resolves and no user would call a slower stack."""
    drift = cell_drift(base, cand) or cell.drift
    graph = (f" (graph: {drift.summary()})" if drift is not None and drift.changed
             else " (the graph facts the gate compares are the same: ops, nodes, inputs and outputs)"
             if drift is not None else "")
    if iv.stack is None:
        return "file", f"the file is slower, in the same runtime stack ({iv.stacks[0]}){graph}"
    f, s = iv.file, iv.stack
    moved = f"{iv.stacks[0]} → {iv.stacks[-1]}"
    bar = noticeable(threshold)
    file_slow, stack_slow = f is not None and f.low > bar, s is not None and s.low > bar
    if file_slow and stack_slow:
        return "both", f"both are slower: the file {f.text()}{graph} and the runtime stack {s.text()} ({moved})"
    if file_slow:
        return "file", f"the file is slower: {f.text()} in either runtime stack{graph}"
    if stack_slow:
        return "stack", f"the runtime stack is slower: {s.text()} for either file ({moved})"
    return "neither", (f"neither the file ({f.text() if f else 'n/a'}) nor the runtime stack "
                       f"({s.text() if s else 'n/a'}, {moved}) alone is shown slower than ×{bar:.2f}")
