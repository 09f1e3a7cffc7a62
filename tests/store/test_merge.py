"""Merging shard runs (synthetic runs: the records of a real split, no environment involved)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.record import Record, read_records
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.matrix.config import ConfigError, Matrix
from harness.matrix.plan import build_plan
from harness.matrix.shards import Costs, shard_identity, split_plan
from harness.store.merge import merge_runs

STATUSES = [Status.PASS, Status.FAIL, Status.SKIP]


def _plan():
    m = Matrix.model_validate(dict(torch=["2.6.0", "2.13.0"], exporters=["torchscript", "dynamo"],
                                   opsets=[17, 18], runtimes=["ort-cpu", "openvino"],
                                   cases=["mha", "conv_bn"]))
    return build_plan(m)


def _shard_runs(root: Path, plan, count: int, costs: Costs | None = None, name: str = "s") -> list[Path]:
    """One finished run directory per shard, as `matrix --shard K/N` leaves them."""
    shards = split_plan(plan, count, costs or Costs(setup_s=1.0))
    assert len(shards) == count
    dirs = []
    for s in shards:
        run_dir = root / f"{name}{s.index}"
        (run_dir / "logs").mkdir(parents=True)
        meta = RunMeta(run_id=f"run-{name}{s.index}", started=float(s.index), ended=10.0 + s.index,
                       finished=True, matrix_hash="m1", fingerprint={"harness": "0.1.0"},
                       plan={"cells": len(s.cells), "environments": [{"name": e.env.name} for e in s.plan.environments]},
                       environments={e.env.name: {"name": e.env.name} for e in s.plan.environments},
                       extra={"shard": {**shard_identity(plan, shards, s.index), "durations": "test"}})
        meta.write(run_dir)
        with open(run_dir / "results.jsonl", "w") as fh:
            for i, c in enumerate(s.cells):
                log = run_dir / "logs" / f"{c.cell_id}.log"
                log.write_text(f"log of {c.cell_id}\n")
                # as on a CI runner: the paths name the directory the shard ran in, not this one
                there = f"/runner/work/shard-run-{s.index}"
                rec = Record.for_cell(meta.run_id, c.key, c.torch, "env", STATUSES[i % 3],
                                      stage="export" if STATUSES[i % 3] is Status.FAIL else None,
                                      log=f"{there}/logs/{log.name}",
                                      repro=f"python -m harness.worker --job {there}/bundles/{c.cell_id}/cell.json")
                fh.write(rec.to_json() + "\n")
        dirs.append(run_dir)
    return dirs


def test_merge_holds_every_shard_record(tmp_path):
    plan = _plan()
    dirs = _shard_runs(tmp_path, plan, 3)
    out = merge_runs(list(reversed(dirs)), tmp_path / "merged")
    merged = read_records(out / "results.jsonl")
    parts = [r for d in dirs for r in read_records(d / "results.jsonl")]
    key = lambda r: (r.cell_id, r.status, r.stage)
    assert sorted(map(key, merged)) == sorted(map(key, parts))
    assert {r.cell_id for r in merged} == {c.cell_id for c in plan.cells}
    assert len({r.run_id for r in merged}) == 1
    for rec in merged:  # logs copied into the merged run and the records point there
        assert Path(rec.log).read_text() == f"log of {rec.cell_id}\n"
        assert Path(rec.log).parent == (out / "logs").resolve()
        assert rec.repro == f"python -m harness.worker --job {out.resolve()}/bundles/{rec.cell_id}/cell.json"
    meta = json.loads((out / "run.json").read_text())
    assert [s["shard"] for s in meta["shards"]] == ["1/3", "2/3", "3/3"]
    assert "shard" not in meta and meta["plan"]["cells"] == len(plan.cells)
    assert meta["started"] == 1.0 and meta["ended"] == 13.0


@pytest.mark.parametrize("drop, message", [(1, "shard 2/3 missing (have 1/3, 3/3)"),
                                            (None, "shard 3/3 is given twice")])
def test_missing_or_repeated_shard_is_named(tmp_path, drop, message):
    dirs = _shard_runs(tmp_path, _plan(), 3)
    runs = [d for i, d in enumerate(dirs) if i != drop] if drop is not None else dirs + [dirs[2]]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        merge_runs(runs, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()  # nothing written before the check


def test_shards_of_another_split_or_plan_are_refused(tmp_path):
    plan = _plan()
    mine = _shard_runs(tmp_path, plan, 3)
    other = _shard_runs(tmp_path, plan, 3, Costs({c.cell_id: float(i) for i, c in enumerate(plan.cells)}, setup_s=1.0), "o")
    with pytest.raises(ConfigError, match="split with other durations"):
        merge_runs([mine[0], mine[1], other[2]], tmp_path / "merged")
    two = _shard_runs(tmp_path, plan, 2, name="t")
    with pytest.raises(ConfigError, match="another plan"):
        merge_runs([mine[0], two[1]], tmp_path / "merged")


def test_a_shard_missing_cells_is_named(tmp_path):
    dirs = _shard_runs(tmp_path, _plan(), 3)
    lines = (dirs[1] / "results.jsonl").read_text().splitlines()
    (dirs[1] / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ConfigError, match=f"shard 2/3 .* holds {len(lines) - 1} cells, not the {len(lines)}"):
        merge_runs(dirs, tmp_path / "merged")


def test_a_plain_run_is_not_a_shard(tmp_path):
    dirs = _shard_runs(tmp_path, _plan(), 2)
    meta = json.loads((dirs[1] / "run.json").read_text())
    del meta["shard"]
    (dirs[1] / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="not shard runs"):
        merge_runs(dirs, tmp_path / "merged")


def test_merge_waits_for_shards_still_running(tmp_path):
    dirs = _shard_runs(tmp_path, _plan(), 2)
    meta = json.loads((dirs[1] / "run.json").read_text())
    meta["finished"] = False
    (dirs[1] / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=f"still not finished: {dirs[1]}"):
        merge_runs(dirs, tmp_path / "merged", wait_s=0.01)


@pytest.mark.parametrize("damage, why", [
    (lambda s: s.pop("count"), "no 'count'"),
    (lambda s: s.update(index="two"), "'index' is 'two', not a whole number"),
    (lambda s: s.update(cells_digest=None), "'cells_digest' is None, not a digest"),
    (lambda s: s.update(index=5), "shard 5 of 2"),
    (lambda s: s.clear() or s.update(x=1), "no 'index'"),
])
def test_a_damaged_shard_entry_is_named_exit_2(tmp_path, capsys, damage, why):
    from harness.cli import main

    dirs = _shard_runs(tmp_path, _plan(), 2)
    meta = json.loads((dirs[1] / "run.json").read_text())
    damage(meta["shard"])
    (dirs[1] / "run.json").write_text(json.dumps(meta))
    rc = main(["--reports", str(tmp_path / "reports"), "merge", *map(str, dirs), "--output", str(tmp_path / "merged")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"error: merge: {dirs[1]}: run.json 'shard' is damaged ({why}); expected what "
                      "`matrix --shard K/N` writes there: re-run that shard")
    assert not (tmp_path / "merged").exists()


def test_a_shard_entry_that_is_not_an_object_is_damaged(tmp_path):
    dirs = _shard_runs(tmp_path, _plan(), 2)
    meta = json.loads((dirs[0] / "run.json").read_text())
    meta["shard"] = "1/2"
    (dirs[0] / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"s1: run.json 'shard' is damaged \(not an object but str\)"):
        merge_runs(dirs, tmp_path / "merged")
