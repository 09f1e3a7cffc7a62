"""Runtime releases per exported file: each passing cell's spooled file loaded and run again in
runtime-only environments (no torch), so a runtime release costs a load and a run, never an export.

Three matrix keys ask for it (``RuntimeAxes``):

- ``runtime_versions: {ort-cpu: [1.18.1, 1.20.1]}``: every release listed, recorded per cell as
  ``graph.runtime_versions {runtime: {version: ReleaseCheck}}``;
- ``runtime_floor: {ort-cpu: [1.16.3, 1.18.1, ...]}``: the oldest listed release that loads the
  file and matches eager, by bisection, as ``graph.runtime_floor {runtime: {oldest_ok,
  first_bad, reason, tried}}`` ("needs onnxruntime >= 1.18.1: IR version 10 (1.16.3 reads up to 9)");
- ``deploy: {ort-cpu: "1.20.1"}``: the release a team ships, as ``graph.deploy {runtime:
  {version, status, stage, error}}``, which the gate blocks on.

Each record also carries the file it reused: ``graph.onnx_file {sha256, ir_version, opsets}``.
Runner side; the worker side is ``harness.worker.runtime_only.release_check``.
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

from harness.core.bisection import bisection
from harness.core.passes import NOT_INSTALLED, asked_releases, releases_missing
from harness.core.record import Record, read_records
from harness.core.wire import CHECK_FAIL, CHECK_PASS, RELEASE_CHECK_MODULE, SPOOL_META, ReleaseCheck
from harness.envs.provider import harness_process_env
from harness.envs.runtime_only import RuntimeOnlyEnvs, RuntimeRelease

PROBE_TIMEOUT_S = 300
INSTALL_STAGE = NOT_INSTALLED   # a release whose environment could not be made: nothing known of the file


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

    def asked(self, runtime: str) -> dict[str, Any]:
        """What each passing file of ``runtime`` is tried on, by the key that asks."""
        return asked_releases(self.versions, self.floor, self.deploy, runtime)


@dataclass
class FloorStats:
    """What the pass cost: files tried, releases probed (load-and-run), environments used."""

    files: int = 0
    probes: int = 0        # load-and-runs
    processes: int = 0     # runtime-only processes started (one per release and round)
    cells: int = 0
    seconds: float = 0.0


def file_facts(path: Path, graph: dict[str, Any]) -> dict[str, Any]:
    """The file's digest, IR version and opset imports (what decides which releases read it).

    The runner has no onnx (not a dependency of the tool): the IR version and opset imports are
    the ones the worker read from this very file when it exported it (``graph_facts``, in the
    record's ``graph``); a record without them is a ``ValueError``."""
    ir_version, opsets = graph.get("ir_version"), graph.get("opset_imports")
    if not isinstance(ir_version, int) or not isinstance(opsets, dict):
        raise ValueError("the record holds no IR version and opset imports of its file (its graph "
                         "facts could not be taken)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"sha256": digest, "ir_version": ir_version, "opsets": {str(d): int(v) for d, v in opsets.items()}}


class ReleaseProber:
    """Runs ``release_check``: each (file, release) once, and every file waiting for one release
    in one process of its runtime-only environment (one start and import per release)."""

    def __init__(self, envs: RuntimeOnlyEnvs | None = None, threads: int = 1) -> None:
        self.envs = envs or RuntimeOnlyEnvs()
        self.threads = threads
        self.done: dict[tuple[str, RuntimeRelease], ReleaseCheck] = {}
        self.probes = 0        # load-and-runs
        self.processes = 0

    def __call__(self, spool: Path, digest: str, release: RuntimeRelease) -> ReleaseCheck:
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

    def _probe(self, spools: list[Path], release: RuntimeRelease) -> list[ReleaseCheck]:
        env = self.envs.get(release)
        if env.error is not None:
            return [ReleaseCheck(CHECK_FAIL, stage=INSTALL_STAGE, error=env.error)] * len(spools)
        self.probes += len(spools)
        self.processes += 1
        cmd = [env.python, "-m", RELEASE_CHECK_MODULE, "--runtime", release.runtime,
               "--threads", str(self.threads), *[a for s in spools for a in ("--spool", str(s))]]
        child_env = harness_process_env(self.threads)
        child_env.pop("VIRTUAL_ENV", None)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env,
                                  timeout=PROBE_TIMEOUT_S * len(spools))
        except subprocess.TimeoutExpired:
            return [ReleaseCheck(CHECK_FAIL, stage="run", error=f"no answer within {PROBE_TIMEOUT_S} s a file")] * len(spools)
        lines = proc.stdout.strip().splitlines()
        try:
            results = [ReleaseCheck.from_dict(d) for d in json.loads(lines[-1])]
            if len(results) == len(spools):
                return results
        except (IndexError, ValueError, TypeError):
            pass
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[:400]
        return [ReleaseCheck(CHECK_FAIL, stage="load", error=f"the runtime's process ended ({proc.returncode}): {tail}")] * len(spools)


_IR = re.compile(r"IR version:?\s*(\d+),\s*max supported IR version:?\s*(\d+)", re.I)
_OPSET = re.compile(r"opset\s*(\d+)\D[^.]*?(?:under development|not supported|max(?:imum)? supported[^\d]*(\d+))", re.I)


def floor_reason(package: str, oldest_ok: str | None, first_bad: str, bad: ReleaseCheck,
                 facts: dict[str, Any]) -> str:
    """Why ``first_bad`` fails where ``oldest_ok`` does not, in the runtime's own words first."""
    needs = f"needs {package} >= {oldest_ok}" if oldest_ok else f"no listed {package} release works"
    error = bad.error or ""
    if m := _IR.search(error):
        return f"{needs}: IR version {m[1]} ({first_bad} reads up to {m[2]})"
    if m := _OPSET.search(error):
        return f"{needs}: opset {m[1]} ({first_bad}: {error[:160]})"
    return f"{needs}: {bad.stage or 'load'} fails on {first_bad}: {error[:200]}"


def floor_search(releases: list[RuntimeRelease], facts: dict[str, Any]) -> Generator[RuntimeRelease, ReleaseCheck, dict[str, Any]]:
    """The oldest release that works, by bisection over ``releases``: yields each release to try,
    is sent what it made of the file, returns ``{oldest_ok, first_bad, reason, tried, listed}``.
    Working is assumed to stay working in newer releases: the newest is tried first, then halves
    between the oldest known to work and the newest known to fail (so ``first_bad`` is always a
    release that was tried). A release that could not be installed says nothing about the file:
    it is left out of the search and named in ``not_installed``, never a ``first_bad``."""
    ordered = sorted(releases, key=lambda r: Version(r.version))
    package = ordered[0].package
    tried: dict[str, ReleaseCheck] = {}
    not_installed: dict[str, str] = {}

    def usable(below: RuntimeRelease | None = None, above: RuntimeRelease | None = None) -> list[RuntimeRelease]:
        return [r for r in ordered if r.version not in not_installed and r.version not in tried
                and (below is None or Version(r.version) < Version(below.version))
                and (above is None or Version(r.version) > Version(above.version))]

    def result(**out: Any) -> dict[str, Any]:
        out["tried"] = {v: _brief(r) for v, r in sorted(tried.items(), key=lambda kv: Version(kv[0]))}
        out["listed"] = [r.version for r in ordered]
        if not_installed:
            out["not_installed"] = dict(not_installed)
        return out

    good = bad = None
    while good is None and (left := usable()):        # the newest release that can be installed
        newest = left[-1]
        tried[newest.version] = answer = yield newest
        if answer.stage == INSTALL_STAGE:
            not_installed[newest.version] = answer.error or "install failed"
        elif answer.status == CHECK_PASS:
            good = newest
        else:
            return result(oldest_ok=None, first_bad=newest.version,
                          reason=floor_reason(package, None, newest.version, answer, facts))
    if good is None:
        return result(oldest_ok=None, first_bad=None,
                      reason=f"no listed {package} release could be installed: the file was tried on none")
    # Between the releases known to fail (below: the virtual index -1) and the oldest known to work,
    # releases that cannot be installed stepped over.
    index = {r.version: i for i, r in enumerate(ordered)}
    skip = {index[v] for v in not_installed}
    search = bisection(-1, index[good.version], middle="upper")
    try:
        i = next(search)
        while True:
            if i in skip:
                i = search.send(None)
                continue
            tried[ordered[i].version] = answer = yield ordered[i]
            if answer.stage == INSTALL_STAGE:
                not_installed[ordered[i].version] = answer.error or "install failed"
            i = search.send(None if answer.stage == INSTALL_STAGE else answer.status != CHECK_PASS)
    except StopIteration as stop:
        lo, hi, _ = stop.value
    good, bad = ordered[hi], (ordered[lo] if lo >= 0 else None)
    return result(oldest_ok=good.version, first_bad=bad.version if bad else None,
                  reason=floor_reason(package, good.version, bad.version, tried[bad.version], facts) if bad else None)


def find_floor(releases: list[RuntimeRelease], works: Callable[[RuntimeRelease], ReleaseCheck],
               facts: dict[str, Any]) -> dict[str, Any]:
    """``floor_search`` driven by ``works`` for one file."""
    return drive({None: floor_search(releases, facts)}, lambda asked: {k: works(r) for k, r in asked.items()})[None]


def drive(searches: dict[Any, Generator], answer: Callable[[dict[Any, RuntimeRelease]], dict[Any, ReleaseCheck]]) -> dict[Any, Any]:
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


def _brief(result: ReleaseCheck) -> str:
    return CHECK_PASS if result.status == CHECK_PASS else f"{result.stage}: {result.error}"[:300]


def annotate_records(records: list[Record], spools: dict[str, Path], runtimes: dict[str, str],
                     axes: RuntimeAxes, prober: ReleaseProber, log: Callable[[str], None] = print) -> FloorStats:
    """Add ``graph.runtime_versions``, ``runtime_floor``, ``deploy`` and ``onnx_file`` to every
    passing record whose runtime is asked for and whose file is spooled (``spools``: cell id →
    spool folder; ``runtimes``: cell id → runtime name). What could not be tried, and why, goes
    into the record's ``passes_not_run``: a file that cannot be read back, a release that could
    not be installed, a cell taken from the store whose run did not try what is asked now."""
    stats = FloorStats()
    t0 = time.monotonic()
    facts_of: dict[Path, dict[str, Any]] = {}
    todo: list[tuple[Record, str, Path]] = []
    for rec in records:
        runtime = runtimes.get(rec.cell_id)
        if not rec.status.passed or runtime not in axes.runtimes():
            continue
        asked = axes.asked(runtime)
        if rec.cached_from:
            # Taken from the store: it keeps what its own run tried (the cell key covers the
            # releases asked, so that is normally everything); anything short of it is said.
            for name, what in releases_missing(rec.graph or {}, runtime, asked).items():
                rec.pass_not_run(name, f"taken from run {rec.cached_from}, which did not try it ({what}); "
                                       "--fresh runs the cell again")
            continue
        spool = spools.get(rec.cell_id)
        try:
            if spool is None:
                raise FileNotFoundError("the plan has no export group for this cell")
            meta = json.loads((spool / SPOOL_META).read_text())
            if "outputs" not in meta:
                raise ValueError("eager's outputs were not kept beside the exported file")
            if spool not in facts_of:
                facts_of[spool] = file_facts(spool / meta["onnx"], rec.graph or {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"the exported file could not be read back from the spool: {type(exc).__name__}: {exc}"
            for name in asked:
                rec.pass_not_run(name, why)
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

    def answer(asked: dict[tuple[Path, str], RuntimeRelease]) -> dict[tuple[Path, str], ReleaseCheck]:
        prober.prefetch([(spool, digest[spool], rel) for (spool, _), rel in asked.items()])
        return {key: prober.done[(digest[key[0]], rel)] for key, rel in asked.items()}

    floors = drive(searches, answer)
    for rec, rt, spool in todo:
        done = {v: prober.done[(digest[spool], RuntimeRelease(rt, v))] for v in axes.versions.get(rt, [])}
        if done:
            rec.graph.setdefault("runtime_versions", {})[rt] = {v: r.to_dict() for v, r in done.items()}
            _say_not_installed(rec, "runtime_versions", rt, done)
        if (spool, rt) in floors:
            floor = rec.graph.setdefault("runtime_floor", {})[rt] = floors[(spool, rt)]
            _say_not_installed(rec, "runtime_floor", rt, {v: ReleaseCheck(CHECK_FAIL, stage=INSTALL_STAGE, error=e)
                                                          for v, e in floor.get("not_installed", {}).items()})
        if rt in axes.deploy:
            result = prober.done[(digest[spool], RuntimeRelease(rt, axes.deploy[rt]))]
            rec.graph.setdefault("deploy", {})[rt] = {"version": axes.deploy[rt], **result.to_dict()}
            _say_not_installed(rec, "deploy", rt, {axes.deploy[rt]: result})
    stats.probes, stats.processes = prober.probes, prober.processes
    stats.seconds = round(time.monotonic() - t0, 2)
    return stats


def _say_not_installed(rec: Record, name: str, runtime: str, results: dict[str, ReleaseCheck]) -> None:
    """The releases of one pass that could not be installed, as the record's pass not run."""
    failed = {v: r for v, r in results.items() if r.stage == INSTALL_STAGE}
    if failed:
        package = RuntimeRelease(runtime, next(iter(failed))).package
        first = next(iter(failed.values()))
        rec.pass_not_run(name, f"{package} {', '.join(failed)} could not be installed, so the file was "
                               f"not tried there: {first.error or 'no reason given'}")


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
    before = [r.to_json() for r in records]
    stats = annotate_records(records, spools, runtimes, axes, ReleaseProber(envs, threads), log)
    if [r.to_json() for r in records] != before:   # facts added, or passes that could not be made
        tmp = results.with_name(results.name + ".floors")
        tmp.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
        os.replace(tmp, results)
    if stats.cells:
        log(f"runtime releases: {stats.cells} cell(s), {stats.files} file(s), {stats.probes} "
            f"load-and-run(s) in {stats.processes} runtime-only process(es), {stats.seconds} s, no export")
    return stats
