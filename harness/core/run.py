"""run.json: a run's metadata (``RunMeta``): identity, times, host, matrix, environments.

Keys are those of schema v1; unknown keys (written by other versions) are kept in ``extra``
and written back unchanged. A finished run's run.json is immutable: ``RunMeta.write`` over it
raises ``FinishedRun`` (everything a run records is known before it finishes).
"""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.core.passes import PassGap
from harness.core.record import SCHEMA_VERSION, SchemaError


def _loadavg() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages when the run started (the run header compares them
    with the CPUs; each timed cell records its own load, ``Latency.loaded``)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


class FinishedRun(RuntimeError):
    """run.json of a finished run was about to be written again."""


@dataclass
class RunMeta:
    run_id: str
    schema: int = SCHEMA_VERSION
    harness: str = ""
    started: float = 0.0
    ended: float | None = None
    finished: bool = False
    host: dict[str, Any] = field(default_factory=dict)
    config: str = ""
    matrix_hash: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)   # name → EnvMarker dict
    resumed: list[float] = field(default_factory=list)
    fingerprint: dict[str, Any] | None = None     # provenance: harness version, case source hashes
    counts: dict[str, int] | None = None
    # The folder the matrix file was in (absolute): relative case file names in the records
    # resolve against it, wherever a later command runs (runs before it: None).
    base_dir: str | None = None
    # Optional passes that could not be made (harness.core.passes.PassGap as dicts), set when the
    # run is finalized: written only when there is one.
    passes_not_run: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # shards, merged, keys of other versions

    @classmethod
    def start(cls, run_id: str, harness: str, config: Path, matrix_hash: str,
              plan: dict[str, Any]) -> "RunMeta":
        return cls(run_id=run_id, harness=harness, started=time.time(), config=str(config),
                   matrix_hash=matrix_hash, plan=plan,
                   host={"name": socket.gethostname(), "platform": platform.platform(),
                         "cpus": os.cpu_count(), "python": platform.python_version(),
                         "loadavg": _loadavg()})

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "run.json") -> "RunMeta":
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            raise SchemaError(f"{where}: not a run's metadata (expected an object with a 'run_id')")
        if int(data.get("schema", 1)) > SCHEMA_VERSION:
            raise SchemaError(f"{where}: written by a newer harness (schema {data['schema']}); "
                              "upgrade to read it")
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for optional in ("fingerprint", "counts", "base_dir", "passes_not_run"):
            if out[optional] is None:
                del out[optional]
        return {**out, **self.extra}

    def gaps(self) -> list[PassGap]:
        """The optional passes this run could not make (``passes_not_run``), as ``PassGap``s."""
        return [PassGap.from_dict(d) for d in self.passes_not_run or [] if isinstance(d, dict)]

    def write(self, run_dir: Path) -> None:
        """Atomically replace run_dir/run.json, unless that holds a finished run (``FinishedRun``)."""
        path = Path(run_dir) / "run.json"
        if _finished_on_disk(path):
            raise FinishedRun(f"{path}: the run {self.run_id} is finished; its run.json is immutable")
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)


def _finished_on_disk(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("finished") is True
