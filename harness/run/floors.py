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
from typing import Any, Callable

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
    probes: int = 0
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
    """Runs ``runtime_probe`` for one (file, release) once: one environment per release."""

    def __init__(self, envs: RuntimeOnlyEnvs | None = None, threads: int = 1) -> None:
        self.envs = envs or RuntimeOnlyEnvs()
        self.threads = threads
        self.done: dict[tuple[str, RuntimeRelease], ProbeResult] = {}
        self.probes = 0

    def __call__(self, spool: Path, digest: str, release: RuntimeRelease) -> ProbeResult:
        key = (digest, release)
        if key not in self.done:
            self.done[key] = self._probe(spool, release)
        return self.done[key]

    def _probe(self, spool: Path, release: RuntimeRelease) -> ProbeResult:
        env = self.envs.get(release)
        if env.error is not None:
            return ProbeResult(FAIL, stage="install", error=env.error)
        self.probes += 1
        cmd = [env.python, "-m", "harness.run.runtime_probe", "--spool", str(spool),
               "--runtime", release.runtime, "--threads", str(self.threads)]
        child_env = harness_process_env(self.threads)
        child_env.pop("VIRTUAL_ENV", None)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return ProbeResult(FAIL, stage="run", error=f"no answer within {PROBE_TIMEOUT_S} s")
        lines = proc.stdout.strip().splitlines()
        try:
            return ProbeResult.from_dict(json.loads(lines[-1]))
        except (IndexError, ValueError):
            tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[:400]
            return ProbeResult(FAIL, stage="load", error=f"the runtime's process ended ({proc.returncode}): {tail}")


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


def find_floor(releases: list[RuntimeRelease], works: Callable[[RuntimeRelease], ProbeResult],
               facts: dict[str, Any]) -> dict[str, Any]:
    """The oldest release that works, by bisection over ``releases`` (working is assumed to
    stay working in newer releases: the newest is tried first, then halves)."""
    ordered = sorted(releases, key=lambda r: Version(r.version))
    tried: dict[str, ProbeResult] = {}

    def ok(i: int) -> bool:
        rel = ordered[i]
        tried[rel.version] = tried.get(rel.version) or works(rel)
        return tried[rel.version].status == PASS

    package = ordered[0].package
    if not ok(len(ordered) - 1):
        newest = ordered[-1].version
        return {"oldest_ok": None, "first_bad": newest,
                "reason": floor_reason(package, None, newest, tried[newest], facts),
                "tried": {v: _brief(r) for v, r in tried.items()}}
    lo, hi = 0, len(ordered) - 1          # ordered[hi] works
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    out: dict[str, Any] = {"oldest_ok": ordered[hi].version, "first_bad": None, "reason": None}
    if hi > 0 and not ok(hi - 1):
        bad = ordered[hi - 1].version
        out.update(first_bad=bad, reason=floor_reason(package, ordered[hi].version, bad, tried[bad], facts))
    out["tried"] = {v: _brief(r) for v, r in sorted(tried.items(), key=lambda kv: Version(kv[0]))}
    return out


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
    for rec in records:
        runtime = runtimes.get(rec.cell_id)
        spool = spools.get(rec.cell_id)
        if rec.status is not Status.PASS or runtime not in axes.runtimes() or spool is None:
            continue
        meta_file = spool / SPOOL_META
        if not meta_file.exists():
            continue
        try:
            meta = json.loads(meta_file.read_text())
            if "outputs" not in meta:
                continue
            if spool not in facts_of:
                facts_of[spool] = file_facts(spool / meta["onnx"])
                stats.files += 1
        except Exception as exc:  # noqa: BLE001 - a file onnx cannot read is noted, never fatal
            rec.notes.append(f"runtime releases not tried: {type(exc).__name__}: {exc}"[:300])
            continue
        facts = facts_of[spool]
        stats.cells += 1
        rec.graph["onnx_file"] = dict(facts)
        digest = facts["sha256"]
        if versions := axes.versions.get(runtime):
            rec.graph.setdefault("runtime_versions", {})[runtime] = {
                v: prober(spool, digest, RuntimeRelease(runtime, v)).to_dict() for v in versions}
        if floor := axes.floor.get(runtime):
            releases = [RuntimeRelease(runtime, v) for v in floor]
            rec.graph.setdefault("runtime_floor", {})[runtime] = find_floor(
                releases, lambda rel: prober(spool, digest, rel), facts)
        if deploy := axes.deploy.get(runtime):
            result = prober(spool, digest, RuntimeRelease(runtime, deploy))
            rec.graph.setdefault("deploy", {})[runtime] = {"version": deploy, **result.to_dict()}
    stats.probes = prober.probes
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
            f"load-and-run(s) in runtime-only environments, {stats.seconds} s, no export")
    return stats
