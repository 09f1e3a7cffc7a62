"""Runtime releases per exported file: each passing cell's spooled file loaded and run again in
runtime-only environments (no torch), so a runtime release costs a load and a run, never an export.

Three matrix keys ask for it (``RuntimeAxes``):

- ``runtime_versions: {ort-cpu: [1.18.1, 1.20.1]}``: every release listed, recorded per cell as
  ``graph.runtime_versions {runtime: {version: ProbeResult}}``;
- ``runtime_floor: {ort-cpu: [1.16.3, 1.18.1, ...]}``: the oldest listed release that loads the
  file and matches eager, by bisection, as ``graph.runtime_floor {runtime: {oldest_ok,
  first_bad, reason, tried}}`` ("needs onnxruntime >= 1.18.1: IR version 10 (1.16.3 reads up to 9)");
- ``deploy: {ort-cpu: "1.20.1"}``: the release a team ships, as ``graph.deploy {runtime:
  {version, status, stage, error}}``, which the gate blocks on.

Each record also carries the file it reused: ``graph.onnx_file {sha256, ir_version, opsets}``.
Runner side; the worker side is ``harness.run.runtime_probe``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator

from packaging.version import Version

from harness.core.record import Record, read_records
from harness.core.status import Status
from harness.envs.provider import harness_process_env
from harness.envs.runtime_only import RuntimeOnlyEnvs, RuntimeRelease
from harness.run.runtime_probe import FAIL, PASS, SPOOL_META, ProbeResult

PROBE_TIMEOUT_S = 300


@dataclass
class RuntimeAxes:
    """The runtime releases a matrix asks each file to be tried on (runtime → releases)."""

    versions: dict[str, list[str]] = field(default_factory=dict)
    floor: dict[str, list[str]] = field(default_factory=dict)
    deploy: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_matrix(cls, matrix: Any) -> "RuntimeAxes":
        return cls({k: list(v) for k, v in (getattr(matrix, "runtime_versions", None) or {}).items()},
                   {k: list(v) for k, v in (getattr(matrix, "runtime_floor", None) or {}).items()},
                   dict(getattr(matrix, "deploy", None) or {}))

    def __bool__(self) -> bool:
        return bool(self.versions or self.floor or self.deploy)

    def runtimes(self) -> set[str]:
        return set(self.versions) | set(self.floor) | set(self.deploy)


@dataclass
class FloorStats:
    """What the pass cost: files tried, releases probed (load-and-run), environments used."""

    files: int = 0
    probes: int = 0        # load-and-runs
    processes: int = 0     # runtime-only processes started (one per release and round)
    cells: int = 0
    seconds: float = 0.0


def file_facts(path: Path) -> dict[str, Any]:
    """The file's digest, IR version and opset imports (what decides which releases read it)."""
    import onnx

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    model = onnx.load(str(path), load_external_data=False)
    return {"sha256": digest, "ir_version": int(model.ir_version),
            "opsets": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}}


class ReleaseProber:
    """Runs ``runtime_probe``: each (file, release) once, and every file waiting for one release
    in one process of its runtime-only environment (one start and import per release)."""

    def __init__(self, envs: RuntimeOnlyEnvs | None = None, threads: int = 1) -> None:
        self.envs = envs or RuntimeOnlyEnvs()
        self.threads = threads
        self.done: dict[tuple[str, RuntimeRelease], ProbeResult] = {}
        self.probes = 0        # load-and-runs
        self.processes = 0

    def __call__(self, spool: Path, digest: str, release: RuntimeRelease) -> ProbeResult:
        self.prefetch([(spool, digest, release)])
        return self.done[(digest, release)]

    def prefetch(self, wanted: list[tuple[Path, str, RuntimeRelease]]) -> None:
        by_release: dict[RuntimeRelease, dict[str, Path]] = {}
        for spool, digest, release in wanted:
            if (digest, release) not in self.done:
                by_release.setdefault(release, {})[digest] = spool
        for release, files in by_release.items():
            for digest, result in zip(files, self._probe(list(files.values()), release)):
                self.done[(digest, release)] = result

    def _probe(self, spools: list[Path], release: RuntimeRelease) -> list[ProbeResult]:
        env = self.envs.get(release)
        if env.error is not None:
            return [ProbeResult(FAIL, stage="install", error=env.error)] * len(spools)
        self.probes += len(spools)
        self.processes += 1
        cmd = [env.python, "-m", "harness.run.runtime_probe", "--runtime", release.runtime,
               "--threads", str(self.threads), *[a for s in spools for a in ("--spool", str(s))]]
        child_env = harness_process_env(self.threads)
        child_env.pop("VIRTUAL_ENV", None)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env,
                                  timeout=PROBE_TIMEOUT_S * len(spools))
        except subprocess.TimeoutExpired:
            return [ProbeResult(FAIL, stage="run", error=f"no answer within {PROBE_TIMEOUT_S} s a file")] * len(spools)
        lines = proc.stdout.strip().splitlines()
        try:
            results = [ProbeResult.from_dict(d) for d in json.loads(lines[-1])]
            if len(results) == len(spools):
                return results
        except (IndexError, ValueError, TypeError):
            pass
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[:400]
        return [ProbeResult(FAIL, stage="load", error=f"the runtime's process ended ({proc.returncode}): {tail}")] * len(spools)


_IR = re.compile(r"IR version:?\s*(\d+),\s*max supported IR version:?\s*(\d+)", re.I)
_OPSET = re.compile(r"opset\s*(\d+)\D[^.]*?(?:under development|not supported|max(?:imum)? supported[^\d]*(\d+))", re.I)


def floor_reason(package: str, oldest_ok: str | None, first_bad: str, bad: ProbeResult,
                 facts: dict[str, Any]) -> str:
    """Why ``first_bad`` fails where ``oldest_ok`` does not, in the runtime's own words first."""
    needs = f"needs {package} >= {oldest_ok}" if oldest_ok else f"no listed {package} release works"
    error = bad.error or ""
    if m := _IR.search(error):
        return f"{needs}: IR version {m[1]} ({first_bad} reads up to {m[2]})"
    if m := _OPSET.search(error):
        return f"{needs}: opset {m[1]} ({first_bad}: {error[:160]})"
    return f"{needs}: {bad.stage or 'load'} fails on {first_bad}: {error[:200]}"


def floor_search(releases: list[RuntimeRelease], facts: dict[str, Any]) -> Generator[RuntimeRelease, ProbeResult, dict[str, Any]]:
    """The oldest release that works, by bisection over ``releases``: yields each release to try,
    is sent what it made of the file, returns ``{oldest_ok, first_bad, reason, tried}``. Working
    is assumed to stay working in newer releases: the newest is tried first, then halves, then
    the release just below the floor (so ``first_bad`` is always a release that was tried)."""
    ordered = sorted(releases, key=lambda r: Version(r.version))
    package = ordered[0].package
    tried: dict[str, ProbeResult] = {}

    def brief() -> dict[str, str]:
        return {v: _brief(r) for v, r in sorted(tried.items(), key=lambda kv: Version(kv[0]))}

    newest = ordered[-1]
    tried[newest.version] = yield newest
    if tried[newest.version].status != PASS:
        return {"oldest_ok": None, "first_bad": newest.version,
                "reason": floor_reason(package, None, newest.version, tried[newest.version], facts),
                "tried": brief()}
    lo, hi = 0, len(ordered) - 1          # ordered[hi] works
    while lo < hi:
        mid = (lo + hi) // 2
        if ordered[mid].version not in tried:
            tried[ordered[mid].version] = yield ordered[mid]
        if tried[ordered[mid].version].status == PASS:
            hi = mid
        else:
            lo = mid + 1
    out: dict[str, Any] = {"oldest_ok": ordered[hi].version, "first_bad": None, "reason": None}
    if hi > 0:
        below = ordered[hi - 1]
        if below.version not in tried:
            tried[below.version] = yield below
        if tried[below.version].status != PASS:
            out.update(first_bad=below.version,
                       reason=floor_reason(package, ordered[hi].version, below.version, tried[below.version], facts))
    out["tried"] = brief()
    return out


def find_floor(releases: list[RuntimeRelease], works: Callable[[RuntimeRelease], ProbeResult],
               facts: dict[str, Any]) -> dict[str, Any]:
    """``floor_search`` driven by ``works`` for one file."""
    return drive({None: floor_search(releases, facts)}, lambda asked: {k: works(r) for k, r in asked.items()})[None]


def drive(searches: dict[Any, Generator], answer: Callable[[dict[Any, RuntimeRelease]], dict[Any, ProbeResult]]) -> dict[Any, Any]:
    """Run many floor searches side by side: each round asks every unfinished search's next
    release at once (``answer`` gets key → release), so one process per release serves them all."""
    results: dict[Any, Any] = {}
    asked: dict[Any, RuntimeRelease] = {}
    for key, search in searches.items():
        try:
            asked[key] = next(search)
        except StopIteration as stop:
            results[key] = stop.value
    while asked:
        answers = answer(asked)
        nxt = {}
        for key, release in asked.items():
            try:
                nxt[key] = searches[key].send(answers[key])
            except StopIteration as stop:
                results[key] = stop.value
        asked = nxt
    return results


def _brief(result: ProbeResult) -> str:
    return PASS if result.status == PASS else f"{result.stage}: {result.error}"[:300]


def annotate_records(records: list[Record], spools: dict[str, Path], runtimes: dict[str, str],
                     axes: RuntimeAxes, prober: ReleaseProber, log: Callable[[str], None] = print) -> FloorStats:
    """Add ``graph.runtime_versions``, ``runtime_floor``, ``deploy`` and ``onnx_file`` to every
    passing record whose runtime is asked for and whose file is spooled (``spools``: cell id →
    spool folder; ``runtimes``: cell id → runtime name)."""
    stats = FloorStats()
    t0 = time.monotonic()
    facts_of: dict[Path, dict[str, Any]] = {}
    todo: list[tuple[Record, str, Path]] = []
    for rec in records:
        runtime = runtimes.get(rec.cell_id)
        spool = spools.get(rec.cell_id)
        if rec.status is not Status.PASS or runtime not in axes.runtimes() or spool is None:
            continue
        try:
            meta = json.loads((spool / SPOOL_META).read_text())
            if "outputs" not in meta:
                continue
            if spool not in facts_of:
                facts_of[spool] = file_facts(spool / meta["onnx"])
        except FileNotFoundError:
            continue       # nothing spooled: the cell came from the store, or an earlier attempt
        except Exception as exc:  # noqa: BLE001 - a file onnx cannot read is noted, never fatal
            rec.notes.append(f"runtime releases not tried: {type(exc).__name__}: {exc}"[:300])
            continue
        rec.graph["onnx_file"] = {**facts_of[spool], "export_group": spool.name}   # the export reused
        todo.append((rec, runtime, spool))
    stats.cells, stats.files = len(todo), len(facts_of)
    digest = {spool: facts["sha256"] for spool, facts in facts_of.items()}
    # Every listed and deployed release, each in one process for all files.
    prober.prefetch([(spool, digest[spool], RuntimeRelease(rt, v)) for _, rt, spool in todo
                     for v in [*axes.versions.get(rt, []), *([axes.deploy[rt]] if rt in axes.deploy else [])]])
    # The floors: one search per (file, runtime), the searches side by side.
    searches = {(spool, rt): floor_search([RuntimeRelease(rt, v) for v in axes.floor[rt]], facts_of[spool])
                for _, rt, spool in todo if rt in axes.floor}

    def answer(asked: dict[tuple[Path, str], RuntimeRelease]) -> dict[tuple[Path, str], ProbeResult]:
        prober.prefetch([(spool, digest[spool], rel) for (spool, _), rel in asked.items()])
        return {key: prober.done[(digest[key[0]], rel)] for key, rel in asked.items()}

    floors = drive(searches, answer)
    for rec, rt, spool in todo:
        if versions := axes.versions.get(rt):
            rec.graph.setdefault("runtime_versions", {})[rt] = {
                v: prober.done[(digest[spool], RuntimeRelease(rt, v))].to_dict() for v in versions}
        if (spool, rt) in floors:
            rec.graph.setdefault("runtime_floor", {})[rt] = floors[(spool, rt)]
        if rt in axes.deploy:
            result = prober.done[(digest[spool], RuntimeRelease(rt, axes.deploy[rt]))]
            rec.graph.setdefault("deploy", {})[rt] = {"version": axes.deploy[rt], **result.to_dict()}
    stats.probes, stats.processes = prober.probes, prober.processes
    stats.seconds = round(time.monotonic() - t0, 2)
    return stats


def annotate_run(run_dir: Path, plan: Any, axes: RuntimeAxes, threads: int = 1,
                 log: Callable[[str], None] = print, install: Any = None) -> FloorStats | None:
    """The floors pass of a run: rewrite results.jsonl with each passing cell's releases, from
    the spool the verdict phase left (cells taken from the store keep what they had)."""
    if not axes:
        return None
    spool_root = Path(run_dir) / "spool"
    spools: dict[str, Path] = {}
    runtimes: dict[str, str] = {}
    for env_plan in plan.environments:
        for group in env_plan.groups():
            for cell in group.cells:
                spools[cell.cell_id] = spool_root / group.gid
                runtimes[cell.cell_id] = cell.runtime_name
    results = Path(run_dir) / "results.jsonl"
    records = read_records(results)
    envs = RuntimeOnlyEnvs(python=getattr(install, "python", None) or "3.11", install=install)
    stats = annotate_records(records, spools, runtimes, axes, ReleaseProber(envs, threads), log)
    if stats.cells:
        tmp = results.with_name(results.name + ".floors")
        tmp.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
        os.replace(tmp, results)
        log(f"runtime releases: {stats.cells} cell(s), {stats.files} file(s), {stats.probes} "
            f"load-and-run(s) in {stats.processes} runtime-only process(es), {stats.seconds} s, no export")
    return stats
