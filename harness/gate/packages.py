"""Any package in the gate: ``gate --package onnxscript --baseline 0.4.0 --candidate 0.5.0``.

Torch is held fixed (the matrix's one torch release); each side is the matrix with that package
pinned to its version. Cells are compared exactly as in a torch gate (marks, exit codes, the
interleaved timing of cells whose latency may have moved); stored cells stand for a side only
when they ran in that side's environment (its name hashes every package it installs), so a
baseline cell is never taken for the candidate.

Which packages: the companions a torch entry pins (``numpy``, ``onnx``, ``onnxscript``,
``protobuf``) and any requirement the matrix installs through ``extras`` (``transformers``,
``optimum-onnx``, ...). A runtime's own package (onnxruntime, openvino) is a runtime release:
``runtime_versions``, ``runtime_floor`` and ``deploy`` try files on its releases without an
export (docs/runtime-floors.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from harness.matrix.config import COMPANIONS, Matrix, TorchSpec
from harness.matrix.rules import ConfigError
from harness.runtimes import RUNTIMES


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PackageBump:
    package: str
    baseline: str
    candidate: str

    def side_label(self, version: str) -> str:
        return f"{self.package} {version}"


def check_bump(matrix: Matrix, bump: PackageBump, config: Path) -> TorchSpec:
    """The torch entry held fixed; ConfigError (exit 2) for a package the matrix does not
    install, a runtime's package, versions that are not releases, or several torch releases."""
    name = _norm(bump.package)
    runtime_packages = {_norm(r.package): n for n, r in RUNTIMES.items()}
    if name in runtime_packages:
        raise ConfigError(f"--package {bump.package}: a runtime's package; try files on its releases with "
                          f"'runtime_versions', 'runtime_floor' or 'deploy' for {runtime_packages[name]} in "
                          f"{config} (docs/runtime-floors.md)")
    for flag, version in (("--baseline", bump.baseline), ("--candidate", bump.candidate)):
        try:
            Version(version)
        except InvalidVersion:
            raise ConfigError(f"{flag} {version!r}: expected a release of {bump.package} such as '0.5.0'") from None
    if Version(bump.baseline) == Version(bump.candidate):
        raise ConfigError(f"--baseline {bump.baseline} and --candidate {bump.candidate} are the same "
                          f"release of {bump.package}: expected two to compare")
    if len(matrix.torch) != 1:
        raise ConfigError(f"{config}: key 'torch': --package holds torch fixed: expected one torch release "
                          f"(got {[t.version for t in matrix.torch]})")
    spec = matrix.torch[0]
    if spec.existing:
        raise ConfigError(f"{config}: key 'torch[0]': --package installs releases of {bump.package}, and "
                          f"{spec.where} is an existing environment, used as it is; expected a torch release "
                          "(or compare two existing environments: gate --baseline-env A --candidate-env B)")
    extras = {_norm(Requirement(e).name) for e in spec.extras}
    if name not in COMPANIONS and name not in extras:
        installs = sorted({*COMPANIONS, *extras})
        raise ConfigError(f"--package {bump.package}: {config} does not install it (expected one of "
                          f"{installs}; add it to 'extras' of the torch entry)")
    return spec


def with_package(matrix: Matrix, spec: TorchSpec, bump: PackageBump, version: str) -> Matrix:
    """The matrix with the package pinned to ``version`` on its one torch entry."""
    name = _norm(bump.package)
    if name in COMPANIONS:
        pinned = spec.model_copy(update={name: version})
    else:
        extras = [e for e in spec.extras if _norm(Requirement(e).name) != name]
        pinned = spec.model_copy(update={"extras": [*extras, f"{bump.package}=={version}"]})
    return matrix.model_copy(update={"torch": [pinned]})


def run_package_gate(req, bump: PackageBump) -> int:
    """The gate with ``bump.package`` moving and everything else held; 0 / 1 / 2 as run_gate."""
    from harness.gate.driver import check_settings, gate_folder, judge
    from harness.gate.sources import complete_side, plan_version_side
    from harness.matrix.config import load_matrix
    from harness.store.provenance import fingerprint

    check_settings(req.settings, req.remeasure)
    matrix = load_matrix(req.config)
    spec = check_bump(matrix, bump, req.config)
    current = fingerprint(matrix, req.config)
    out = gate_folder(req)
    versions = {"baseline": bump.baseline, "candidate": bump.candidate}
    matrices = {which: with_package(matrix, spec, bump, v) for which, v in versions.items()}
    pending = {}
    for which, side_matrix in matrices.items():
        pending[which] = plan_version_side(spec.version, side_matrix, req.config, req.reports, current)
        pending[which].side.label = pending[which].side.subject = bump.side_label(versions[which])
    check_resolvable(pending, versions, req)
    sides = {which: complete_side(pending[which], req.config, req.reports, req.provider, current)
             for which in versions}
    return judge(sides, matrices, matrix, req, out, current)


def check_resolvable(pending: dict, versions: dict[str, str], req) -> None:
    """Resolve both sides' environments before anything is built: a release the index lacks is
    exit 2 naming the option that asked for it."""
    from harness.envs import make_provider
    from harness.envs.resolve import preflight

    provider = make_provider(req.provider, log=lambda *a, **k: None)
    for which, p in pending.items():
        if not p.missing.environments:
            continue
        try:
            preflight(p.missing, req.config, skip=provider.skip_reason,
                      ready=getattr(provider, "is_ready", lambda spec: False))
        except ConfigError as exc:
            raise ConfigError(f"--{which} {versions[which]}: {exc}") from None


def run_package_bisect(req, out=print) -> int:
    """``bisect --package NAME --good A --bad B``: the release of NAME between A and B where a
    cell's verdict changes, torch and every other pin held. Exit codes as a torch bisect."""
    from harness.gate.bisect import Bisector, bisect, final_releases, index_releases, releases_between, select_keys, verdict_of
    from harness.matrix.config import load_matrix

    matrix = load_matrix(req.config)
    bump = PackageBump(req.package, req.good, req.bad)
    for flag, version in (("--good", req.good), ("--bad", req.bad)):
        try:
            Version(version)
        except InvalidVersion:
            raise ConfigError(f"{flag} {version!r}: expected a release of {req.package} such as '0.5.0'") from None
    if Version(req.good) == Version(req.bad):
        raise ConfigError("--good and --bad name the same release")
    spec = check_bump(matrix, bump, req.config)
    held = spec.version
    keys = select_keys(matrix, held, req.cell, req.config)
    releases = req.releases if req.releases is not None else index_releases(matrix.install.index_url, req.package)
    versions = releases_between(final_releases(releases), req.good, req.bad)
    bisector = Bisector(matrix, req.config, req.reports, keys, req.provider)
    # Both ends, and every release the user listed, resolved before anything is built.
    asked = {f"--good {req.good}": req.good, f"--bad {req.bad}": req.bad}
    if req.releases is not None:
        asked.update({f"--releases {v}": v for v in versions if v not in asked.values()})
    bisector.check_installable({option: (held, with_package(matrix, spec, bump, v)) for option, v in asked.items()})
    out(f"bisect {len(keys)} cell(s) over {len(versions)} {req.package} releases (torch {held} held): "
        f"{', '.join(versions)}")

    def verdict(key):
        return lambda v: verdict_of(bisector.records(held, with_package(matrix, spec, bump, v),
                                                     f"{held} with {req.package} {v}").get(key))

    code = 0
    for key in keys:
        search = bisect(versions, verdict(key))
        tried = " · ".join(f"{v} {search.verdicts[v] or 'untestable'}" for v in search.verdicts)
        out(f"\n{key.name}\n  tried: {tried}")
        if search.boundary is None:
            out(f"  {(search.note or '').replace('torch ', req.package + ' ')}")
            code = 1
            continue
        older, newer = search.boundary
        out(f"  verdict changes between {req.package} {older} and {newer} "
            f"({search.verdicts[older]} → {search.verdicts[newer]})")
        if search.note:
            out(f"  {search.note}")
            code = 1
    if bisector.runs:
        out(f"\nruns stored: {', '.join(bisector.runs)} (under {req.reports / 'runs'})")
    return code
