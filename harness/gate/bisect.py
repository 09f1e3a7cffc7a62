"""Bisect across torch releases: between a good and a bad release, which release changed a
cell's verdict?

The releases come from the package index (``pip index versions torch``, final releases only);
each one tried is an ordinary environment (cached like any other) and its cells an ordinary run
under reports/runs, so the report and the gate can use them and a later bisect reuses them
(``gate.sources``: stored results of the same code count, missing ones are run). Works both
ways: ``good`` older than ``bad`` finds a regression, newer finds a fix.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from harness.console import console
from harness.core.bisection import bisection, run_search
from harness.core.cell import CellKey
from harness.core.record import Record
from harness.core.status import Stage, Status
from harness.gate.sources import run_cells, say_refusals, stored_records, version_plan
from harness.gate.swap import which_change
from harness.matrix.config import Matrix, load_matrix
from harness.matrix.plan import Plan
from harness.matrix.rules import ConfigError
from harness.store.provenance import fingerprint
from harness.store.reuse import BISECT, Reused

RELEASE_NOTES = "https://github.com/pytorch/pytorch/releases/tag/v{version}"


# ---- the releases -----------------------------------------------------------------------------

def final_releases(versions: list[str]) -> list[str]:
    """Final releases only (no pre, dev, post or local versions), oldest first, deduplicated."""
    out = set()
    for text in versions:
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        if not (v.is_prerelease or v.is_devrelease or v.is_postrelease or v.local):
            out.add(str(v))
    return sorted(out, key=Version)


def index_releases(index_url: str | None = None, package: str = "torch") -> list[str]:
    """The releases of ``package`` the package index holds: ``pip index versions``, else the
    index's JSON simple API (PEP 691/700)."""
    pip = [sys.executable, "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True).returncode != 0:
        pip = [shutil.which("pip3") or shutil.which("pip") or "pip"]
    cmd = [*pip, "index", "versions", package, "--disable-pip-version-check"]
    if index_url:
        cmd += ["--index-url", index_url]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        found = re.search(r"Available versions:\s*(.+)", proc.stdout)
        if found:
            return final_releases([v.strip() for v in found.group(1).split(",")])
    except (OSError, subprocess.TimeoutExpired):
        pass
    url = (index_url or "https://pypi.org/simple").rstrip("/") + f"/{package}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return final_releases(json.load(response).get("versions", []))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot list {package} releases from the index ({exc}); pass --releases") from None


def releases_between(releases: list[str], good: str, bad: str) -> list[str]:
    """The releases from ``good`` to ``bad`` inclusive, in that direction (both ends always)."""
    lo, hi = sorted((Version(good), Version(bad)))
    inside = {str(Version(v)) for v in releases if lo <= Version(v) <= hi} | {good, bad}
    ordered = sorted(inside, key=Version)
    return ordered if Version(good) <= Version(bad) else ordered[::-1]


# ---- the search -------------------------------------------------------------------------------

@dataclass
class Search:
    """One cell's search over ``versions`` (ordered from the good end to the bad end)."""

    versions: list[str]
    verdicts: dict[str, str | None] = field(default_factory=dict)   # tried release → verdict
    last_good: str | None = None
    first_bad: str | None = None
    note: str | None = None

    @property
    def found(self) -> bool:
        return self.last_good is not None and self.first_bad is not None and self.note is None

    @property
    def boundary(self) -> tuple[str, str] | None:
        """The two adjacent releases where the verdict changes, older first."""
        if self.last_good is None or self.first_bad is None:
            return None
        return tuple(sorted((self.last_good, self.first_bad), key=Version))  # type: ignore[return-value]


def bisect(versions: list[str], verdict: Callable[[str], str | None]) -> Search:
    """Binary search for the first release whose verdict differs from the good end's.

    ``verdict(version)`` is a short text ('pass', 'fail (check)') or None when the release
    cannot be tested (skipped, its environment could not be built); such releases are stepped
    over, as ``git bisect skip`` does.
    """
    search = Search(versions)

    def judge(i: int) -> str | None:
        v = versions[i]
        if v not in search.verdicts:
            search.verdicts[v] = verdict(v)
        return search.verdicts[v]

    good, bad = judge(0), judge(len(versions) - 1)
    if good is None or bad is None:
        which = versions[0] if good is None else versions[-1]
        search.note = f"torch {which} cannot be tested for this cell"
        return search
    if good == bad:
        search.note = f"same verdict on both ends ({good}): nothing to bisect"
        return search
    def old_side(i: int) -> bool | None:
        v = judge(i)
        return None if v is None else v == good

    lo, hi, _ = run_search(bisection(0, len(versions) - 1), old_side)
    search.last_good, search.first_bad = versions[lo], versions[hi]
    if hi - lo > 1:
        skipped = ", ".join(versions[i] for i in range(lo + 1, hi))
        search.note = f"untestable releases in between: {skipped}"
    return search


def verdict_of(rec: Record | None) -> str | None:
    """What bisect compares: 'pass', 'fail (stage)', 'crash', 'timeout'; None when untestable
    (skipped, or the matrix's own error: no verdict on the model)."""
    if rec is None or rec.status in (Status.SKIP, Status.ERROR):
        return None
    error = rec.error or ""
    if rec.status is Status.CRASH and error.startswith("EnvironmentBuildError"):
        return None
    if rec.stage == Stage.EXPORT.value and error.startswith(("ModuleNotFoundError", "ImportError")):
        return None   # the environment lacks what torch.onnx imports (a companion pin too old)
    if rec.status.passed:
        return Status.PASS.value
    if rec.status in (Status.FAIL, Status.XFAIL):
        return f"{Status.FAIL.value} ({rec.stage})"
    return rec.status.value


# ---- cells and runs ---------------------------------------------------------------------------

def key_id(key: CellKey) -> str:
    """A cell's id without its torch part: 'conv_bn-dynamo-op13-ort-cpu'."""
    return re.sub(r"^torch[^-]*-", "", key.cell_id("0"))


def select_keys(matrix: Matrix, bad: str, cell: str | None, config: Path) -> list[CellKey]:
    """The cells to bisect: the one ``cell`` names (a cell id with or without its torch part, or a
    key name 'case · exporter · op13 · runtime'), else every cell of the matrix."""
    keys = list(dict.fromkeys(c.key for c in version_plan(matrix, bad)[1].cells))
    if cell is None:
        return keys
    wanted = re.sub(r"^torch[^-]*-", "", cell.strip())
    chosen = [k for k in keys if wanted in (key_id(k), k.name)]
    if not chosen:
        sample = ", ".join(key_id(k) for k in keys[:3])
        raise ConfigError(f"{config}: no cell {cell!r} in this matrix (cell ids look like {sample})")
    return chosen


@dataclass
class Bisector:
    """Verdicts per (release, cell), each release's cells run once (as an ordinary stored run)."""

    matrix: Matrix
    config: Path
    reports: Path
    keys: list[CellKey]
    provider: str = "venv"
    runs: list[str] = field(default_factory=list)
    _seen: dict[str, dict[CellKey, Record]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.current = fingerprint(self.matrix, self.config)

    def _planned(self, version: str, matrix: Matrix | None = None) -> tuple[Matrix, Plan, list[Record], Reused]:
        """The bisected cells on ``version`` (of ``matrix``, a variant with other pins) and the
        stored records of them the bisect policy takes: the gate's, from the very environment
        planned now (its name hashes every pin), so a release retried after a companion pin
        changed is run again."""
        restricted, plan = version_plan(matrix or self.matrix, version)
        plan = plan.restricted({c.cell_id for c in plan.cells if c.key in self.keys})
        env_of = {c.cell_id: e.env.name for e in plan.environments for c in e.cells}
        stored, _, reused = stored_records(plan, self.current, self.reports, Path(self.config).resolve().parent,
                                           BISECT, env_of)
        return restricted, plan, stored, reused

    def check_installable(self, releases: dict[str, tuple[str, Matrix | None]]) -> None:
        """Resolve, before anything is built, the environments of each release still to run
        (option → (torch version, matrix variant)): a release the index lacks is exit 2 naming
        the option that asked for it, as the gate does, never a failing environment."""
        from harness.envs import make_provider
        from harness.envs.resolve import preflight

        provider = make_provider(self.provider, log=lambda *a, **k: None)
        problems = []
        for option, (version, matrix) in releases.items():
            _, plan, stored, _ = self._planned(version, matrix)
            missing = plan.restricted({c.cell_id for c in plan.cells} - {r.cell_id for r in stored})
            try:
                preflight(missing, self.config, skip=provider.skip_reason,
                          ready=getattr(provider, "is_ready", lambda spec: False))
            except ConfigError as exc:
                problems.append(f"{option}: {exc}")
        if problems:
            raise ConfigError("\n".join(problems))

    def records(self, version: str, matrix: Matrix | None = None, label: str | None = None) -> dict[CellKey, Record]:
        """The cells on ``version``; ``matrix``/``label``: a variant of it (other companion pins)."""
        version_label = label or version
        if version_label not in self._seen:
            restricted, plan, stored, reused = self._planned(version, matrix)
            found: dict[CellKey, Record] = {}
            if plan.cells:
                say_refusals(f"bisect: torch {version_label}", reused, len(plan.cells))
                found = {r.key: r for r in stored}
                missing = {c.cell_id for c in plan.cells if c.key not in found}
                if missing:
                    console.print(f"bisect: torch {version_label}: running {len(missing)} cell(s)")
                    run_dir = run_cells(restricted, self.config, plan.restricted(missing), None,
                                        self.reports, self.provider, self.current)
                    from harness.store.runs import load_run

                    meta, new = load_run(run_dir)
                    self.runs.append(meta.run_id)
                    found.update({r.key: r for r in new if r.cell_id in missing})
                else:
                    console.print(f"bisect: torch {version}: stored results reused")
            self._seen[version_label] = found
        return self._seen[version_label]

    def verdict(self, key: CellKey) -> Callable[[str], str | None]:
        return lambda version: verdict_of(self.records(version).get(key))


def companion_changes(matrix: Matrix, older: str, newer: str) -> list[str]:
    """Packages other than torch whose pins differ between two releases' environments: a verdict
    change may come from them (e.g. onnxscript moves with torch)."""
    from harness.gate.swap import env_pins

    a, b = env_pins(matrix, older), env_pins(matrix, newer)
    return [f"{n} {a.get(n, '—')} → {b.get(n, '—')}" for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]


@dataclass
class BisectRequest:
    good: str
    bad: str
    config: Path
    reports: Path
    cell: str | None = None
    releases: list[str] | None = None     # instead of asking the index
    provider: str = "venv"
    package: str | None = None            # bisect this package's releases, torch held (gate.packages)


def run_bisect(req: BisectRequest, out: Callable[[str], None] = print) -> int:
    """Exit 0: every cell's change was found; 1: a cell has nothing to bisect or could not be
    narrowed to two adjacent releases; 2 (ConfigError): bad input. A request with ``package``
    goes to ``harness.gate.packages.run_package_bisect`` (the command line chooses)."""
    if req.package is not None:
        raise ValueError("a package bisection: harness.gate.packages.run_package_bisect")
    for name, v in (("--good", req.good), ("--bad", req.bad)):
        try:
            Version(v)
        except InvalidVersion:
            raise ConfigError(f"{name}: {v!r} is not a torch release such as '2.13.0'") from None
    if Version(req.good) == Version(req.bad):
        raise ConfigError("--good and --bad name the same release")
    matrix = load_matrix(req.config)
    keys = select_keys(matrix, req.bad, req.cell, req.config)
    releases = req.releases if req.releases is not None else index_releases(matrix.install.index_url)
    versions = releases_between(final_releases(releases), req.good, req.bad)
    bisector = Bisector(matrix, req.config, req.reports, keys, req.provider)
    asked = {f"--good {req.good}": req.good, f"--bad {req.bad}": req.bad}
    if req.releases is not None:
        asked.update({f"--releases {v}": v for v in versions if v not in asked.values()})
    bisector.check_installable({option: (v, None) for option, v in asked.items()})
    out(f"bisect {len(keys)} cell(s) over {len(versions)} torch releases: {', '.join(versions)}")
    code = 0
    for key in keys:
        search = bisect(versions, bisector.verdict(key))
        tried = " · ".join(f"{v} {search.verdicts[v] or 'untestable'}" for v in search.verdicts)
        out(f"\n{key.name}\n  tried: {tried}")
        if search.boundary is None:
            out(f"  {search.note}")
            code = 1
            continue
        older, newer = search.boundary
        out(f"  verdict changes between {older} and {newer} "
            f"({search.verdicts[older]} → {search.verdicts[newer]})")
        out(f"  release notes: {RELEASE_NOTES.format(version=newer)}")
        if search.note:
            out(f"  {search.note}")
            code = 1
        if changed := companion_changes(matrix, older, newer):
            out(f"  note: the two environments also differ in {', '.join(changed)}")
            # The boundary again with the older pins (harness.gate.swap): torch or a pin?
            flipped = which_change(matrix, older, newer, search.verdicts,
                                   lambda variant, label: verdict_of(
                                       bisector.records(newer, variant, label).get(key)))
            if flipped:
                out(f"  {flipped}")
    if bisector.runs:
        out(f"\nruns stored: {', '.join(bisector.runs)} (under {req.reports / 'runs'})")
    return code
