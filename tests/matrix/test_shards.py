from __future__ import annotations

import json

import pytest
from helpers import TESTS, run_harness

from harness.core.record import read_records
from harness.matrix.config import ConfigError, Matrix
from harness.matrix.plan import build_plan
from harness.matrix.shards import parse_shard, shard_plan


def test_shards_partition_the_plan_by_export_group():
    m = Matrix.model_validate(dict(torch=["2.6.0", "2.13.0"], exporters=["torchscript", "dynamo"],
                                   opsets=[13, 17, 18], runtimes=["ort-cpu", "openvino"],
                                   cases=["mha", "conv_bn", "sdpa"]))
    plan = build_plan(m)
    shards = [shard_plan(plan, k, 4) for k in range(1, 5)]
    ids = [c.cell_id for s in shards for c in s.cells]
    assert sorted(ids) == sorted(c.cell_id for c in plan.cells)  # every cell exactly once
    assert all(s.cells for s in shards)
    for s in shards:  # an export group (both runtimes) never straddles two shards
        for e in s.environments:
            groups = {c.group_key for c in e.cells}
            for other in shards:
                if other is not s:
                    assert not groups & {c.group_key for oe in other.environments
                                         if oe.env.name == e.env.name for c in oe.cells}
    assert [c.cell_id for c in shard_plan(plan, 2, 4).cells] == [c.cell_id for c in shards[1].cells]


@pytest.mark.parametrize("bad", ["0/2", "3/2", "a/b", "1-2"])
def test_bad_shard_spec(bad):
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(bad)


@pytest.mark.e2e
def test_two_real_shards_merge_into_one_run(tmp_path):
    config = str(TESTS / "matrices" / "shards.yaml")
    for k in (1, 2):
        run_harness("matrix", "--config", config, "--output", str(tmp_path / f"s{k}"), "--shard", f"{k}/2")
    run_harness("merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--output", str(tmp_path / "all"))
    merged = read_records(tmp_path / "all" / "results.jsonl")
    parts = [read_records(tmp_path / f"s{k}" / "results.jsonl") for k in (1, 2)]
    assert len(merged) == 4 and all(parts)
    assert {r.cell_id for r in merged} == {r.cell_id for p in parts for r in p}
    assert len({r.run_id for r in merged}) == 1
    meta = json.loads((tmp_path / "all" / "run.json").read_text())
    assert meta["finished"] and len(meta["shards"]) == 2
    assert (tmp_path / "all" / "matrix.md").exists()
    proc = run_harness("merge", str(tmp_path / "s1"), str(tmp_path / "s1"), "--output",
                       str(tmp_path / "dup"), check=False)
    assert proc.returncode == 2 and "in both" in proc.stderr
