"""The gate between two existing environments: ``gate --baseline-env A --candidate-env B``.

Each side is an interpreter (a path, or a venv's folder) or a local Docker image, used as it is
(``harness.envs.existing``): the matrix file gives the cases, exporters, opsets and runtimes; its
torch list is replaced by that one environment, whose torch is whatever is installed there.
"Does our new image still export and run our models like the current one?"

Cells are compared as in a torch gate (marks, exit codes, coverage rule, the re-measurement of
cells flagged slower, the reports); stored cells stand for a side only when they ran in an
environment with the same installed set (its identity names the environment), so an environment
changed in place runs again. The reports list the packages whose versions differ first.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.matrix.config import IMAGE_REF, Matrix, TorchSpec
from harness.matrix.rules import ConfigError

SIDES = ("baseline", "candidate")
def env_entry(ref: str, option: str) -> TorchSpec:
    """The torch entry an option's value names: an interpreter that exists (a venv's folder
    stands for its bin/python), else a Docker image name; ConfigError for neither."""
    base = Path(os.environ.get("HARNESS_INVOKED_FROM") or Path.cwd())
    path = Path(os.path.expanduser(ref))
    path = path if path.is_absolute() else base / path
    if path.is_dir() and (path / "bin" / "python").exists():
        path = path / "bin" / "python"
    if path.is_file():
        return TorchSpec(python=os.path.abspath(path))
    if ref.startswith(("/", ".", "~")):
        raise ConfigError(f"{option} {ref!r}: no such interpreter; expected a path to python, or a venv's "
                          "folder")
    if IMAGE_REF.match(ref):
        return TorchSpec(image=ref)
    raise ConfigError(f"{option} {ref!r}: expected an interpreter (a path to python, or a venv's folder) "
                      "or the name of a Docker image on this machine")


def side_matrices(matrix: Matrix, refs: dict[str, str], config: Path) -> dict[str, Matrix]:
    """Per side, the matrix with that environment as its one torch entry, read (both at once);
    every problem of both sides in one ConfigError."""
    from harness.envs.existing import probe_matrix

    def read(which: str) -> Matrix | ConfigError:
        option = f"--{which}-env"
        try:
            entry = env_entry(refs[which], option)
            return probe_matrix(matrix.model_copy(update={"torch": [entry]}), config,
                                keys={0: f"{option} {refs[which]}"})
        except ConfigError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=2) as pool:
        out = dict(zip(SIDES, pool.map(read, SIDES)))
    problems = [str(m) for m in out.values() if isinstance(m, ConfigError)]
    if problems:
        raise ConfigError("\n".join(problems))
    a, b = (out[w].torch[0].found for w in SIDES)
    if a.identity == b.identity:
        raise ConfigError(f"--baseline-env {refs['baseline']} and --candidate-env {refs['candidate']} hold the "
                          f"same installed packages (identity {a.identity}): expected two different "
                          "environments to compare")
    return out  # type: ignore[return-value]


def run_env_gate(req) -> int:
    """``req``: a ``GateRequest`` whose baseline and candidate are the two environments; 0 no
    regression, 1 regression, ConfigError (2) when the gate cannot compare."""
    from harness.gate.driver import check_settings, gate_folder, judge
    from harness.gate.sources import complete_side, plan_version_side
    from harness.matrix.config import load_matrix
    from harness.store.provenance import fingerprint

    check_settings(req.settings, req.remeasure)
    matrix = load_matrix(req.config)
    refs = {"baseline": req.baseline, "candidate": req.candidate}
    matrices = side_matrices(matrix, refs, req.config)
    current = fingerprint(matrix, req.config)
    out = gate_folder(req)
    pending = {}
    for which in SIDES:
        entry = matrices[which].torch[0]
        found = entry.found
        pending[which] = plan_version_side(entry.version, matrices[which], req.config, req.reports, current)
        side = pending[which].side
        side.label, side.subject, side.environment = refs[which], f"{refs[which]} (torch {found.torch})", found
    sides = {which: complete_side(pending[which], req.config, req.reports, req.provider, current)
             for which in SIDES}
    return judge(sides, matrices, matrix, req, out, current)
