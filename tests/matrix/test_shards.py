from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, TESTS, run_harness

from harness.core.cell import CellKey
from harness.core.record import Record, read_records
from harness.core.status import Status
from harness.matrix.config import ConfigError, Matrix, load_matrix
from harness.matrix.engines import github_matrix, plan_document, render_k8s
from harness.matrix.plan import build_plan
from harness.matrix.shards import (
    Costs,
    balance,
    env_label,
    parse_shard,
    shard_plan,
    split_plan,
)
from harness.matrix_run import cell_seconds, read_costs


def _small_plan():
    m = Matrix.model_validate(dict(torch=["2.6.0", "2.13.0"], exporters=["torchscript", "dynamo"],
                                   opsets=[13, 17, 18], runtimes=["ort-cpu", "openvino"],
                                   cases=["mha", "conv_bn", "sdpa"]))
    return build_plan(m)


def _groups_of(shard):
    return {(env_label(e), c.group_key) for e in shard.plan.environments for c in e.cells}


def test_shards_partition_the_plan_by_export_group():
    plan = _small_plan()
    shards = split_plan(plan, 4)
    assert len(shards) == 4 and all(s.cells for s in shards)
    ids = [c.cell_id for s in shards for c in s.cells]
    assert sorted(ids) == sorted(c.cell_id for c in plan.cells)  # every cell exactly once
    for s in shards:  # an export group (both runtimes) never straddles two shards
        for other in shards:
            if other is not s:
                assert not _groups_of(s) & _groups_of(other)
    assert [c.cell_id for c in shard_plan(plan, 2, 4).cells] == [c.cell_id for c in shards[1].cells]


@pytest.mark.parametrize("count", [2, 3, 8])
def test_default_matrix_shards(count, record_property):
    """matrix.yaml planned for 2, 3 and 8 shards: every cell once, whole export groups, each
    shard installing only the environments of its cells, GPU environments only on shards that
    get a GPU runner, few environments installed twice, and balanced."""
    plan = build_plan(load_matrix(ROOT / "matrix.yaml"))
    shards = split_plan(plan, count)
    assert [s.label for s in shards] == [f"{k}/{count}" for k in range(1, count + 1)]
    ids = [c.cell_id for s in shards for c in s.cells]
    assert len(ids) == len(set(ids)) and set(ids) == {c.cell_id for c in plan.cells}
    for s in shards:
        for other in shards:
            if other is not s:
                assert not _groups_of(s) & _groups_of(other)
        # the environments a shard installs are exactly those hosting its cells
        assert all(e.cells for e in s.plan.environments)
        mine = {c.cell_id for c in s.cells}
        hosting = {env_label(e) for e in plan.environments for c in e.cells if c.cell_id in mine}
        assert set(s.environments) == hosting
        assert s.gpu == any(e.env.needs_gpu for e in s.plan.environments)
    gpu_envs = {env_label(e) for e in plan.environments if e.env.needs_gpu}
    assert gpu_envs and any(s.gpu for s in shards) and not all(s.gpu for s in shards)
    installs = sum(len(s.environments) for s in shards)
    # Environment affinity: no more installs than cutting the environments into `count`
    # consecutive runs would cost; with 2 shards the CPU and GPU halves balance exactly whole.
    assert installs <= len(plan.environments) + count - 1
    if count == 2:
        assert installs == len(plan.environments)
        assert [set(s.environments) for s in shards] == [
            {env_label(e) for e in plan.environments if not e.env.needs_gpu}, gpu_envs]
    b = balance(shards)
    record_property("balance", b)
    print(f"{count} shards: largest/mean {b['ratio']} ({b['largest_s']} s / {b['mean_s']} s), "
          f"{installs} installs of {len(plan.environments)} environments: "
          + "; ".join(f"{s.label} {len(s.cells)} cells {' '.join(s.environments)}" for s in shards))
    assert b["ratio"] <= 1.05


def test_previous_durations_split_only_the_dominating_environment():
    """One environment ten times as slow as the other: it alone is split, the other stays whole,
    and the estimated shards are balanced."""
    plan = _small_plan()
    slow = plan.environments[1]
    durations = {c.cell_id: (20.0 if c in slow.cells else 2.0) for c in plan.cells}
    costs = Costs(durations, setup_s=60)
    shards = split_plan(plan, 4, costs)
    where = Counter(env for s in shards for env in s.environments)
    assert where[env_label(plan.environments[0])] == 1
    assert where[env_label(slow)] >= 3
    assert balance(shards)["ratio"] < 1.1
    # the same durations in another insertion order give the same split
    reordered = Costs(dict(reversed(list(durations.items()))), setup_s=60)
    assert [[c.cell_id for c in s.cells] for s in split_plan(plan, 4, reordered)] == \
        [[c.cell_id for c in s.cells] for s in shards]


def test_unknown_durations_take_the_mean_of_their_runtime():
    plan = _small_plan()
    ort = [c for c in plan.cells if c.key.runtime == "ort-cpu"]
    ov = [c for c in plan.cells if c.key.runtime == "openvino"]
    known = {ort[0].cell_id: 3.0, ort[1].cell_id: 5.0, ov[0].cell_id: 7.0}
    per_cell = Costs(known).per_cell(plan.cells)
    assert per_cell[ort[5].cell_id] == 4.0 and per_cell[ov[5].cell_id] == 7.0
    assert per_cell[ort[0].cell_id] == 3.0


def test_split_is_a_fixed_point():
    """A split asked for more shards than help returns fewer; asking for that many gives the
    same shards (what a CI job told "K/N" recomputes)."""
    plan = _small_plan()
    for count in (3, 7, 40):
        shards = split_plan(plan, count)
        again = split_plan(plan, len(shards))
        assert [[c.cell_id for c in s.cells] for s in again] == [[c.cell_id for c in s.cells] for s in shards]
    with pytest.raises(ConfigError, match="at most"):
        shard_plan(plan, 1, 1000)


def test_cell_seconds_share_the_export_of_a_group():
    key = CellKey("mha", "dynamo", 18, "ort-cpu")
    recs = [Record.for_cell("r", CellKey("mha", "dynamo", 18, rt), "2.13.0", "env", Status.PASS,
                            duration_s={"export": 1.0, "check": 0.2, "load": 0.1, "latency": 1.5},
                            log="logs/group-a.log") for rt in ("ort-cpu", "openvino")]
    recs.append(Record.for_cell("r", key, "2.6.0", "env2", Status.PASS,
                                duration_s={"export": 0.4, "run": 0.1}, log="logs/group-b.log"))
    seconds = cell_seconds(recs)
    assert seconds[recs[0].cell_id] == pytest.approx(1.6 + 1.2 / 2)
    assert seconds[recs[2].cell_id] == pytest.approx(0.5)


def _fake_run(reports: Path, run_id: str, records: list[Record], **extra) -> Path:
    from harness.core.run import RunMeta
    from harness.store.runs import update_index

    run_dir = reports / "runs" / run_id
    run_dir.mkdir(parents=True)
    meta = RunMeta(run_id=run_id, started=float(run_id[-1]), ended=1.0, finished=True, extra=extra)
    meta.write(run_dir)
    (run_dir / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    update_index(run_dir, reports)
    return run_dir


def test_auto_durations_come_from_whole_runs_in_the_store(tmp_path):
    plan = _small_plan()
    cells = plan.cells[:3]

    def recs(run_id, seconds):
        return [Record.for_cell(run_id, c.key, c.torch, "env", Status.PASS, duration_s={"run": seconds},
                                log=f"logs/{c.cell_id}.log") for c in cells]
    reports = tmp_path / "reports"
    _fake_run(reports, "20260101-000000-aaaaa1", recs("a", 1.0))
    _fake_run(reports, "20260101-000000-aaaaa2", recs("b", 9.0)[:1])
    # a newer shard run is not a whole run: its durations are not read
    _fake_run(reports, "20260101-000000-aaaaa3", recs("c", 50.0), shard={"index": 1, "count": 2})
    costs = read_costs("auto", reports, {c.cell_id for c in plan.cells})
    assert costs.cells == {cells[0].cell_id: 9.0, cells[1].cell_id: 1.0, cells[2].cell_id: 1.0}
    assert costs.source == "20260101-000000-aaaaa2, 20260101-000000-aaaaa1"
    assert read_costs("none", reports).cells == {}
    with pytest.raises(ConfigError, match="--durations"):
        read_costs("no-such-run", reports)


def test_plan_json_round_trips_its_durations(tmp_path):
    """The JSON plan carries the durations it was split with; reading it back as --durations
    gives the same split (how every CI job computes the plan job's split)."""
    plan = _small_plan()
    durations = {c.cell_id: float(i % 7 + 1) / 3 for i, c in enumerate(plan.cells)}
    costs = Costs(durations, setup_s=30, source="run-x")
    shards = split_plan(plan, 5, costs)
    doc = plan_document(plan, shards, costs, ["--config", "matrix.yaml"])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    back = read_costs(str(path), tmp_path)
    assert back.cells == durations and back.setup_s == 30 and back.source == "run-x"
    assert [s["cell_ids"] for s in doc["shards"]] == [[c.cell_id for c in s.cells]
                                                      for s in split_plan(plan, 5, back)]


def test_plan_output_is_the_same_under_any_hash_seed(tmp_path):
    plan = build_plan(load_matrix(ROOT / "matrix.yaml"))
    durations = tmp_path / "d.json"
    durations.write_text(json.dumps({c.cell_id: (i * 7919 % 13) / 4 for i, c in enumerate(plan.cells)}))
    outs = []
    for seed in ("0", "4242"):
        proc = run_harness("plan", "--format", "json", "--shards", "8", "--durations", str(durations),
                           env={"PYTHONHASHSEED": seed})
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert doc["durations"]["source"] == str(durations) and doc["shard_count"] == 8


def test_plan_github_format():
    plan = build_plan(load_matrix(ROOT / "matrix.yaml"))
    proc = run_harness("plan", "--format", "github", "--shards", "3", "--durations", "none",
                       "--gpu-runner-label", "self-hosted,linux,gpu")
    include = json.loads(proc.stdout)["include"]
    assert [e["shard"] for e in include] == ["1/3", "2/3", "3/3"]
    assert sum(e["cells"] for e in include) == len(plan.cells)
    shards = split_plan(plan, 3)
    for entry, shard in zip(include, shards):
        assert entry["environments"] == " ".join(shard.environments)
        if shard.gpu:
            assert entry["runs-on"] == ["self-hosted", "linux", "gpu"] and entry["gpu"]
            assert entry["provider"] == "docker"
        else:
            assert entry["runs-on"] == "ubuntu-latest" and not entry["gpu"] and entry["provider"] == "venv"
    assert any(e["gpu"] for e in include)
    # no GPU runner registered: every shard on hosted runners, nothing built in Docker
    hosted = github_matrix(shards, "ubuntu-latest", "")["include"]
    assert all(e["runs-on"] == "ubuntu-latest" and not e["gpu"] for e in hosted)


def test_plan_one_shard_as_text():
    plan = build_plan(load_matrix(ROOT / "matrix.yaml"))
    shard = split_plan(plan, 3)[1]
    out = run_harness("plan", "--shard", "2/3", "--durations", "none").stdout.splitlines()
    assert [line.strip() for line in out if line.startswith("  ")] == [c.cell_id for c in shard.cells]
    assert [line.split(":")[0] for line in out if not line.startswith(" ")][:-1] == \
        [e.env.name for e in shard.plan.environments]
    assert out[-1] == f"{len(shard.cells)} cells in {len(shard.plan.environments)} environments"
    summary = run_harness("plan", "--shards", "3", "--durations", "none").stdout
    assert "largest/mean" in summary and summary.count("shard ") == 3


@pytest.mark.parametrize("args, message", [
    (["plan", "--shards", "0"], "--shards"),
    (["plan", "--shard", "2/1"], "--shard"),
    (["plan", "--durations", "/nonexistent.json", "--shards", "2"], "--durations"),
    (["plan", "--config", str(TESTS / "matrices" / "shards.yaml"), "--shard", "1/9"], "at most 4 shards"),
    (["matrix", "--config", str(TESTS / "matrices" / "shards.yaml"), "--shard", "5/9"], "at most 4 shards"),
])
def test_bad_shard_arguments_exit_2(args, message, tmp_path):
    proc = run_harness(*args, "--reports", str(tmp_path), check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["0/2", "3/2", "a/b", "1-2"])
def test_bad_shard_spec(bad):
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(bad)


@pytest.mark.parametrize("gpu_resource", [None, "nvidia.com/gpu"])
def test_k8s_manifests_index_every_shard_once(gpu_resource):
    """The rendered manifests parse; completion indexes map onto shards 1..N exactly once, GPU
    shards (when they request a GPU) on their own Indexed Job; the merge Job lists every shard."""
    import re

    plan = build_plan(load_matrix(ROOT / "matrix.yaml"))
    shards = split_plan(plan, 5)
    doc = plan_document(plan, shards, Costs(), ["--config", "matrix.yaml", "--only", "case=mha|gru"])
    docs = [d for d in yaml.safe_load_all(render_k8s(doc, "img:1", "runs", gpu_resource=gpu_resource)) if d]
    kinds = Counter(d["kind"] for d in docs)
    indexed = [d for d in docs if d["kind"] == "Job" and d["spec"].get("completionMode") == "Indexed"]
    assert kinds["PersistentVolumeClaim"] == 1 and kinds["ConfigMap"] == 1
    assert len(indexed) == (2 if gpu_resource else 1) and kinds["Job"] == len(indexed) + 1
    assert sum(j["spec"]["completions"] for j in indexed) == len(shards)
    mapped = {}
    for job in indexed:
        container = job["spec"]["template"]["spec"]["containers"][0]
        script = container["args"][0]
        offset = int(re.search(r"JOB_COMPLETION_INDEX \+ (\d+)", script).group(1))
        assert f'--shard "$K/{len(shards)}"' in script and "--only 'case=mha|gru'" in script
        gpu = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        for index in range(job["spec"]["completions"]):
            mapped[index + offset] = gpu
    assert sorted(mapped) == list(range(1, len(shards) + 1))
    for s in shards:
        assert mapped[s.index] == (1 if gpu_resource and s.gpu else None)
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert json.loads(config["data"]["plan.json"])["split_digest"] == doc["split_digest"]
    merge = next(d for d in docs if d["kind"] == "Job" and d not in indexed)
    merge_script = merge["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert all(f"/shards/{k} " in merge_script + " " for k in range(1, len(shards) + 1))
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")["metadata"]["name"]
    for job in indexed + [merge]:
        volumes = job["spec"]["template"]["spec"]["volumes"]
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": claim}} in volumes


def test_plan_format_k8s_cli(tmp_path):
    out = tmp_path / "k8s.yaml"
    run_harness("plan", "--format", "k8s", "--shards", "4", "--image", "reg/tom:1", "--pvc", "tom-runs",
                "--durations", "none", "--output", str(out))
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "ConfigMap", "Job", "Job"]
    assert docs[2]["spec"]["completions"] == 4
    assert docs[2]["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/tom:1"


def _records(run_dir: Path) -> dict[str, tuple]:
    return {r.cell_id: (r.status, r.stage, r.case, r.exporter, r.opset, r.runtime, r.torch)
            for r in read_records(run_dir / "results.jsonl")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """tests/matrices/shards.yaml run whole, once for the two tests that compare shards with it."""
    out = tmp_path_factory.mktemp("whole") / "run"
    run_harness("matrix", "--config", str(TESTS / "matrices" / "shards.yaml"), "--output", str(out))
    return out


@pytest.mark.e2e
def test_two_real_shards_merge_into_the_whole_run(tmp_path, whole):
    """Two real shards merged hold the same records (ids, verdicts, stages) as the matrix run
    whole; a repeated or missing shard is an error naming it."""
    config = str(TESTS / "matrices" / "shards.yaml")
    for k in (1, 2):
        run_harness("matrix", "--config", config, "--output", str(tmp_path / f"s{k}"), "--shard", f"{k}/2")
    run_harness("merge", str(tmp_path / "s2"), str(tmp_path / "s1"), "--output", str(tmp_path / "all"))
    merged, whole_records = _records(tmp_path / "all"), _records(whole)
    parts = [_records(tmp_path / f"s{k}") for k in (1, 2)]
    assert len(whole_records) == 4 and all(parts) and merged == whole_records
    assert len({r.run_id for r in read_records(tmp_path / "all" / "results.jsonl")}) == 1
    meta = json.loads((tmp_path / "all" / "run.json").read_text())
    assert meta["finished"] and [s["shard"] for s in meta["shards"]] == ["1/2", "2/2"]
    assert "shard" not in meta and meta["counts"] == json.loads((whole / "run.json").read_text())["counts"]
    shard_meta = json.loads((tmp_path / "s1" / "run.json").read_text())["shard"]
    assert shard_meta["index"] == 1 and shard_meta["count"] == 2 and shard_meta["plan_cells"] == 4
    for rec in read_records(tmp_path / "all" / "results.jsonl"):  # logs travel with the merged run
        assert Path(rec.log).is_file() and Path(rec.log).parent == (tmp_path / "all" / "logs").resolve()
    assert (tmp_path / "all" / "matrix.md").exists()
    proc = run_harness("merge", str(tmp_path / "s1"), str(tmp_path / "s1"), "--output",
                       str(tmp_path / "dup"), check=False)
    assert proc.returncode == 2 and "shard 1/2 is given twice" in proc.stderr
    proc = run_harness("merge", str(tmp_path / "s2"), "--output", str(tmp_path / "one"), check=False)
    assert proc.returncode == 2 and "shard 1/2 missing" in proc.stderr


@pytest.mark.e2e
def test_nightly_workflow_runs_every_shard_locally(tmp_path, whole):
    """nightly.yml's own steps, run here: the plan job's GitHub JSON feeds a loop over its shards,
    the merge job joins them; the merged run equals the matrix run whole."""
    sys.path.insert(0, str(Path(__file__).parent))
    from workflow_local import run_workflow

    config = TESTS / "matrices" / "shards.yaml"
    result = run_workflow(config, 2, tmp_path / "wf")
    include = result["matrix"]["include"]
    assert [e["shard"] for e in include] == ["1/2", "2/2"]
    assert all(e["runs-on"] == "ubuntu-latest" and e["provider"] == "venv" for e in include)
    merged = result["merge_dir"] / "reports" / "runs" / "nightly-local"
    assert _records(merged) == _records(whole)
    # The night appended to the history (the results branch's nights/) and its site published.
    (night,) = (result["merge_dir"] / "results" / "nights").glob("*.json.gz")
    assert (result["merge_dir"] / "night" / night.name).exists()       # the record job's artifact
    site = result["merge_dir"] / "reports" / "site"
    assert f'href="nights/{night.name[:-len(".json.gz")]}.html"' in (site / "index.html").read_text()
    assert (site / "docs" / "matrix-file" / "index.html").exists()
    # what the next night's plan job splits by: this night's durations
    assert read_costs(str(result["merge_dir"] / "previous"), tmp_path).cells.keys() == _records(merged).keys()
