"""Merging finished shard runs into one run (the shards come from ``harness.matrix.shards``).

A shard run records in run.json which shard of which plan and split it was (``shard``: index,
count, digests of the plan's cell ids, of the split and of its own cells). The merge is exact:
every shard of the split exactly once, each holding exactly its cells, or an error naming the
shard; the merged records are the shards' records (only ``run_id`` and paths into the shard
directories change), so they equal those of the same matrix run whole.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

from harness.core.record import Record, append_record, read_records
from harness.core.run import RunMeta
from harness.matrix.rules import ConfigError
from harness.matrix.shards import digest
from harness.store.reductions import append_reduction, read_reductions
from harness.store.runs import new_run_id, read_run_meta

POLL_S = 10.0


def wait_for_runs(run_dirs: list[Path], timeout_s: float, poll_s: float = POLL_S) -> None:
    """Block until every directory holds a finished run (shards still running elsewhere)."""
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = [d for d in run_dirs if not _finished(d)]
        if not waiting:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConfigError(f"merge: after {timeout_s:g} s still not finished: "
                              f"{', '.join(str(d) for d in waiting)}")
        time.sleep(min(poll_s, left))


def _finished(run_dir: Path) -> bool:
    try:
        return read_run_meta(run_dir).finished
    except (FileNotFoundError, ValueError):
        return False


# What a shard run's run.json 'shard' entry holds (harness.matrix.shards.shard_identity).
_SHARD_INTS = ("index", "count", "cells", "plan_cells")
_SHARD_DIGESTS = ("plan_digest", "split_digest", "cells_digest")


def _check_shard_entry(run_dir: Path, entry: object) -> None:
    """ConfigError naming the shard's directory when its 'shard' entry is not one."""
    def damaged(why: str) -> ConfigError:
        return ConfigError(f"merge: {run_dir}: run.json 'shard' is damaged ({why}); expected what "
                           "`matrix --shard K/N` writes there: re-run that shard")

    if not isinstance(entry, dict):
        raise damaged(f"not an object but {type(entry).__name__}")
    for key in _SHARD_INTS:
        value = entry.get(key)
        if key not in entry:
            raise damaged(f"no '{key}'")
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key in ("index", "count") else 0):
            raise damaged(f"'{key}' is {value!r}, not a whole number")
    for key in _SHARD_DIGESTS:
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise damaged(f"'{key}' is {entry.get(key)!r}, not a digest" if key in entry else f"no '{key}'")
    if entry["index"] > entry["count"]:
        raise damaged(f"shard {entry['index']} of {entry['count']}")


def check_shards(run_dirs: list[Path], metas: list[RunMeta]) -> None:
    """Every shard of one split exactly once, each with exactly its own cells; else ConfigError
    naming the shard (missing, given twice, of another plan or split, incomplete)."""
    ids = [m.extra.get("shard") for m in metas]
    for d, m in zip(run_dirs, metas):
        if "shard" in m.extra:
            _check_shard_entry(d, m.extra["shard"])
    plain = [str(d) for d, s in zip(run_dirs, ids) if not isinstance(s, dict)]
    if plain:
        raise ConfigError(f"merge: not shard runs (no 'shard' in run.json): {', '.join(plain)}; "
                          "run them with --shard K/N")
    first, where = ids[0], run_dirs[0]
    count = int(first["count"])
    for d, s in zip(run_dirs, ids):
        label = f"{s['index']}/{s['count']}"
        if int(s["count"]) != count or s["plan_digest"] != first["plan_digest"]:
            raise ConfigError(f"merge: shard {label} ({d}) belongs to another plan than shard "
                              f"{first['index']}/{count} ({where}): same matrix file, filters, "
                              "--torch and shard count are needed")
        if s["split_digest"] != first["split_digest"]:
            raise ConfigError(f"merge: shard {label} ({d}) was split with other durations than shard "
                              f"{first['index']}/{count} ({where}) (durations {s.get('durations')!r} vs "
                              f"{first.get('durations')!r}): give every shard the same --durations")
    seen: dict[int, Path] = {}
    for d, s in zip(run_dirs, ids):
        index = int(s["index"])
        if index in seen:
            raise ConfigError(f"merge: shard {index}/{count} is given twice: {seen[index]} and {d}")
        seen[index] = d
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in seen]
    if missing:
        raise ConfigError(f"merge: shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                          f"missing (have {', '.join(f'{k}/{count}' for k in sorted(seen))})")
    union: list[str] = []
    for d, s in zip(run_dirs, ids):
        cells = [r.cell_id for r in read_records(d / "results.jsonl")]
        if digest(cells) != s["cells_digest"]:
            raise ConfigError(f"merge: shard {s['index']}/{count} ({d}) holds {len(cells)} cells, not "
                              f"the {s['cells']} cells of its share of the plan: re-run it")
        union += cells
    if digest(union) != first["plan_digest"] or len(union) != int(first["plan_cells"]):
        raise ConfigError(f"merge: the shards hold {len(union)} cells, the plan {first['plan_cells']}")


def merge_runs(run_dirs: list[Path], output: Path, wait_s: float = 0.0) -> Path:
    """One run from finished shard runs: records concatenated in shard order (a cell twice is an
    error), logs, bundles and reductions copied, run.json environments unioned, the shards listed."""
    if wait_s > 0:
        wait_for_runs(run_dirs, wait_s)
    metas = [read_run_meta(d) for d in run_dirs]
    unfinished = [str(d) for d, m in zip(run_dirs, metas) if not m.finished]
    if unfinished:
        raise ConfigError(f"merge: runs not finished: {', '.join(unfinished)}")
    hashes = {m.matrix_hash for m in metas}
    if len(hashes) > 1:
        raise ConfigError(f"merge: shards come from different matrices ({sorted(hashes)})")
    prints = {json.dumps(m.fingerprint, sort_keys=True) for m in metas}
    if len(prints) > 1:
        raise ConfigError("merge: shards ran different code (harness version or case sources differ "
                          "in their run.json fingerprints)")
    sharded = any("shard" in m.extra for m in metas)
    if sharded:
        check_shards(run_dirs, metas)
        order = sorted(range(len(metas)), key=lambda i: int(metas[i].extra["shard"]["index"]))
        run_dirs, metas = [run_dirs[i] for i in order], [metas[i] for i in order]
    if output.exists() and any(output.iterdir()):
        raise ConfigError(f"merge: --output {output} exists and is not empty")
    output.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(hashes.pop())
    seen: dict[str, Path] = {}
    for d in run_dirs:
        _copy_tree(d / "logs", output / "logs")
        _copy_tree(d / "bundles", output / "bundles")
        for rec in read_records(d / "results.jsonl"):
            if rec.cell_id in seen:
                raise ConfigError(f"merge: cell {rec.cell_id} is in both {seen[rec.cell_id]} and {d}")
            seen[rec.cell_id] = d
            append_record(output / "results.jsonl", _moved(rec, run_id, d, output))
        # Each shard's reductions (made before it finished): their bundles are the merged run's now.
        old, new = str(d.resolve()), str(output.resolve())
        for cid, outcome in read_reductions(d).items():
            append_reduction(output, cid, json.loads(json.dumps(outcome).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])))
    for sidecar in ("fingerprint.json",):
        if (run_dirs[0] / sidecar).exists():
            shutil.copy2(run_dirs[0] / sidecar, output / sidecar)
    shards = [{"run_id": m.run_id, "dir": str(d),
               **({"shard": f"{m.extra['shard']['index']}/{m.extra['shard']['count']}"} if sharded else {})}
              for d, m in zip(run_dirs, metas)]
    environments: dict[str, dict] = {}
    for m in metas:
        for name, marker in m.environments.items():
            environments.setdefault(name, marker)
    plan_envs = list({e["name"]: e for m in metas for e in m.plan.get("environments", [])}.values())
    extra = {k: v for k, v in metas[0].extra.items() if k != "shard"}
    if sharded:
        extra["plan_digest"] = metas[0].extra["shard"]["plan_digest"]
    meta = replace(metas[0], run_id=run_id, started=min(m.started for m in metas),
                   ended=max(m.ended or 0 for m in metas), finished=False, resumed=[], counts=None,
                   environments=environments,
                   plan={"cells": len(seen), "environments": plan_envs},
                   extra={**extra, "shards": shards, "merged": time.time()})
    meta.write(output)      # unfinished until the workflow finalizes it into the store (once)
    (output / "shards.json").write_text(json.dumps(shards, indent=2))
    return output


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a shard's logs or bundles; a file present twice (a worker log of an environment
    split over shards) is appended to."""
    if not src.is_dir():
        return
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            with open(target, "ab") as out:
                out.write(path.read_bytes())
        else:
            shutil.copy2(path, target)


def _moved(rec: Record, run_id: str, shard_dir: Path, output: Path) -> Record:
    """The record with the merged run's id and its log, bundle and repro paths in the merged run
    (the shard may have run elsewhere: its directory there is the one its log lies in)."""
    new = str(output.resolve())
    prefixes = [str(shard_dir.resolve())]
    if rec.log and Path(rec.log).parent.name == "logs":
        prefixes.append(str(Path(rec.log).parent.parent))
    rec.run_id = run_id
    for name in ("log", "bundle", "repro"):
        value = getattr(rec, name)
        for old in prefixes:
            if value and old in value:
                setattr(rec, name, value.replace(old, new))
                break
    return rec
