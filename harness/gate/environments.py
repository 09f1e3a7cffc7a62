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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.core.env import ExistingEnv
from harness.gate.sources import Side
from harness.matrix.config import IMAGE_REF, Matrix, TorchSpec
from harness.matrix.rules import ConfigError
from harness.report.text import md_code, md_text

SIDES = ("baseline", "candidate")
SHOWN = 40   # rows of the package table in gate.md (all of them are in gate.json)
# The packages a reader looks for first; the rest follow in alphabetical order.
FIRST = ("torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "numpy",
         "protobuf", "transformers", "optimum", "optimum-onnx", "torchvision", "timm")


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


def package_changes(base: ExistingEnv, cand: ExistingEnv) -> list[tuple[str, str, str]]:
    """(package, baseline, candidate) for each package whose version differs, is on one side
    only, or has the same version built from other files; Python first when it differs."""
    before, after = base.versions, cand.versions
    rows = []
    if base.python_version != cand.python_version:
        rows.append(("python", base.python_version, cand.python_version))
    if base.facts.get("cuda") != cand.facts.get("cuda"):
        rows.append(("CUDA (torch's)", str(base.facts.get("cuda") or "none"), str(cand.facts.get("cuda") or "none")))
    order = {name: i for i, name in enumerate(FIRST)}
    for name in sorted(set(before) | set(after), key=lambda n: (order.get(n, len(order)), n)):
        b, c = before.get(name, "—"), after.get(name, "—")
        if b != c:
            rows.append((name, b, c))
        elif base.hashes.get(name) and cand.hashes.get(name) and base.hashes[name] != cand.hashes[name]:
            rows.append((name, f"{b} (files {base.hashes[name][:8]})", f"{c} (files {cand.hashes[name][:8]})"))
    return rows


def packages_markdown(base: Side, cand: Side) -> list[str]:
    """gate.md's first section for two environments: the packages that differ between them."""
    if base.environment is None or cand.environment is None:
        return []
    rows = package_changes(base.environment, cand.environment)
    lines = ["", f"### Packages that differ ({len(rows)})", "",
             f"Baseline {md_code(base.environment.where)}, candidate {md_code(cand.environment.where)}."]
    if not rows:
        return lines + ["", "Same package versions on both sides."]
    lines += ["", "| package | baseline | candidate |", "|---|---|---|"]
    lines += [f"| {md_text(n)} | {md_text(b)} | {md_text(c)} |" for n, b, c in rows[:SHOWN]]
    if len(rows) > SHOWN:
        lines.append(f"\n{len(rows) - SHOWN} more in gate.json (`packages_differ`).")
    return lines


def run_env_gate(req) -> int:
    """``req``: a ``GateRequest`` whose baseline and candidate are the two environments; 0 no
    regression, 1 regression, ConfigError (2) when the gate cannot compare."""
    from harness.gate.compare import compare_sides
    from harness.gate.main import check_settings, conclude
    from harness.gate.retime import SideSource, retime
    from harness.gate.sources import (
        check_environments,
        complete_side,
        plan_version_side,
    )
    from harness.matrix.config import load_matrix
    from harness.run.annotate import Annotator
    from harness.store.provenance import fingerprint

    check_settings(req.settings, req.remeasure)
    matrix = load_matrix(req.config)
    refs = {"baseline": req.baseline, "candidate": req.candidate}
    matrices = side_matrices(matrix, refs, req.config)
    current = fingerprint(matrix, req.config)
    out = req.output or req.reports / "gates" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    pending = {}
    for which in SIDES:
        entry = matrices[which].torch[0]
        found = entry.found
        pending[which] = plan_version_side(entry.version, matrices[which], req.config, req.reports, current)
        side = pending[which].side
        side.label, side.subject, side.environment = refs[which], f"{refs[which]} (torch {found.torch})", found
    sides = {which: complete_side(pending[which], req.config, req.reports, req.provider, current)
             for which in SIDES}
    check_environments(sides)
    base, cand = sides["baseline"], sides["candidate"]
    cells = compare_sides(base, cand, Annotator(matrix.xfail), req.settings, matrix.deploy)
    retime(cells, [SideSource(which, sides[which], matrices[which]) for which in SIDES], req, out, current)
    return conclude(cells, base, cand, req.settings, out, current, req.remeasure)
