"""Provenance: which code produced a run's results (harness version, case source hashes), and
whether two runs' results of one case are comparable. Lets the gate and the cell cache reuse
stored results only when nothing that decides them has changed."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import __version__
from harness.core.cell import CaseRef
from harness.core.files import expand_declared
from harness.core.paths import HARNESS_DIR, RESULT_CODE_DIRS
from harness.core.run import RunMeta
from harness.probes import PROBES

if TYPE_CHECKING:
    from harness.matrix.config import Matrix

# The code that decides a cell's status and numbers; other modules only plan or report.
RESULT_CODE = tuple(f"{d}/**/*.py" for d in RESULT_CODE_DIRS)
FINGERPRINT_FILE = "fingerprint.json"


def _sha(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def case_source(ref: str, base_dir: Path) -> Path | None:
    """The file that defines a case, found without importing it (the gate has no torch)."""
    parsed = CaseRef.try_parse(PROBES.get(ref, ref))
    if parsed is None:
        return None
    if parsed.is_file:
        path = Path(parsed.target) if Path(parsed.target).is_absolute() else base_dir / parsed.target
        return path if path.exists() else None
    try:
        spec = importlib.util.find_spec(parsed.target)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and Path(spec.origin).exists() else None


def fingerprint(matrix: "Matrix", config_path: Path) -> dict[str, Any]:
    """Harness version, a hash per case (its source file and the data files its entry declares),
    and (for diagnosis) of the result code. What a case imports or opens beyond these is only
    known once it ran: each record's ``case_files`` (checked by the cache and the gate)."""
    code = [p for pattern in RESULT_CODE for p in HARNESS_DIR.glob(pattern)]
    cases = {}
    base = config_path.resolve().parent
    for case in matrix.cases:
        src = case_source(case.target, base)
        declared = [Path(p) for p in expand_declared(getattr(case, "data_files", []) or [], base)]
        cases[case.label] = _sha([src, *declared]) if src else None
    return {"harness": __version__, "code": _sha(code), "cases": cases}


def run_fingerprint(run_dir: Path, meta: RunMeta) -> dict[str, Any] | None:
    """A run's fingerprint: in run.json when the runner records it, else the gate's sidecar."""
    if isinstance(meta.fingerprint, dict):
        return meta.fingerprint
    sidecar = Path(run_dir) / FINGERPRINT_FILE
    return json.loads(sidecar.read_text()) if sidecar.exists() else None


def same_code(a: dict[str, Any] | None, b: dict[str, Any] | None, case: str) -> bool | None:
    """True/False when both fingerprints know the case; None when either side was not recorded."""
    if not a or not b:
        return None
    # "code" is kept for diagnosis only: it changes with any edit to a runtime a cell does not
    # use, and would make every stored result stale; the released harness version is the contract.
    if a.get("harness") != b.get("harness"):
        return False
    ca, cb = a.get("cases", {}).get(case), b.get("cases", {}).get(case)
    return None if ca is None or cb is None else ca == cb
