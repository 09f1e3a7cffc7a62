"""The torch gate: does bumping torch from a baseline to a candidate break or slow down any cell?

Resolve both sides (stored runs, or a torch version whose missing cells are run now; every
environment either side still has to build resolved for both sides before anything runs), then
judge them with the one gate driver (``harness.gate.driver``). Exit 2 also for identical sides, a
torch version the package index does not have, or an environment that could not be built
(raised as ConfigError for the CLI to map; the CLI maps any other error to 2 as well).
"""
from __future__ import annotations

from harness.gate.driver import GateRequest, check_settings, gate_folder, judge
from harness.gate.sources import (
    PendingSide,
    complete_side,
    plan_version_side,
    run_side_or_none,
    same_side,
    version_plan,
)
from harness.matrix.config import Matrix, load_matrix
from harness.matrix.rules import ConfigError
from harness.store.provenance import fingerprint


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
    out = gate_folder(req)
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
    return judge(sides, {"baseline": matrix, "candidate": matrix}, matrix, req, out, current)
