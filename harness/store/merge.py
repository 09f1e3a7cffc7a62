"""Merging finished shard runs into one run (the shards come from ``harness.matrix.shards``)."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from harness.core.record import append_record, read_records
from harness.matrix.rules import ConfigError
from harness.store.runs import new_run_id, read_run_meta


def merge_runs(run_dirs: list[Path], output: Path) -> Path:
    """One run from finished shard runs: records concatenated (a cell twice is an error), run.json
    environments unioned, the shards listed; then the usual reports."""
    metas = [read_run_meta(d) for d in run_dirs]
    unfinished = [str(d) for d, m in zip(run_dirs, metas) if not m.finished]
    if unfinished:
        raise ConfigError(f"merge: runs not finished: {', '.join(unfinished)}")
    hashes = {m.matrix_hash for m in metas}
    if len(hashes) > 1:
        raise ConfigError(f"merge: shards come from different matrices ({sorted(hashes)})")
    output.mkdir(parents=True, exist_ok=False)
    run_id = new_run_id(hashes.pop())
    seen: dict[str, Path] = {}
    for d in run_dirs:
        for rec in read_records(d / "results.jsonl"):
            if rec.cell_id in seen:
                raise ConfigError(f"merge: cell {rec.cell_id} is in both {seen[rec.cell_id]} and {d}")
            seen[rec.cell_id] = d
            rec.run_id = run_id
            append_record(output / "results.jsonl", rec)
    shards = [{"run_id": m.run_id, "dir": str(d)} for d, m in zip(run_dirs, metas)]
    meta = replace(metas[0], run_id=run_id, started=min(m.started for m in metas),
                   ended=max(m.ended or 0 for m in metas), finished=True,
                   environments={k: v for m in metas for k, v in m.environments.items()},
                   extra={**metas[0].extra, "shards": shards, "merged": time.time()})
    meta.write(output)
    (output / "shards.json").write_text(json.dumps(shards, indent=2))
    return output
