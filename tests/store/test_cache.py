"""The cell cache: which stored records a new run may take (hit/miss rules), and an index that
survives damaged runs and a lost or broken index file."""
from __future__ import annotations

import json

import pytest

from harness.core.env import EnvMarker
from harness.core.record import Record, append_record
from harness.core.run import RunMeta
from harness.core.status import Status
from harness.matrix.config import Matrix
from harness.matrix.plan import build_plan
from harness.store.cache import INDEX_FILE, CellCache, KeyContext, adopt, unannotated
from harness.store.provenance import fingerprint

INSTALLED = ["numpy==2.4.6", "onnx==1.23.2", "onnxruntime==1.32.0", "torch==2.13.0"]


def setup(tmp_path, source="def tiny():\n    return 1\n", **changes):
    case = tmp_path / "cases.py"
    if not case.exists() or changes.pop("rewrite", False):
        case.write_text(source)
    spec = {"torch": ["2.13.0"], "exporters": ["dynamo"], "opsets": [18], "runtimes": ["ort-cpu"],
            "cases": ["cases.py:tiny"], **changes}
    matrix = Matrix.model_validate(spec)
    config = tmp_path / "m.yaml"
    plan = build_plan(matrix)
    env_plan = plan.environments[0]
    return matrix, config, env_plan, env_plan.cells[0]


def key(tmp_path, installed=INSTALLED, provider="venv", **changes):
    matrix, config, env_plan, cell = setup(tmp_path, **changes)
    context = KeyContext.for_run(matrix, fingerprint(matrix, config), provider)
    return cell, context.key(cell, env_plan.env, EnvMarker.for_spec(env_plan.env, installed=list(installed)))


def store_run(reports, run_id, records, finished=True):
    run_dir = reports / "runs" / run_id
    run_dir.mkdir(parents=True)
    meta = RunMeta.start(run_id, "0.1.0", reports / "m.yaml", "hash", {})
    meta.finished = finished
    meta.write(run_dir)
    for rec in records:
        append_record(run_dir / "results.jsonl", rec)
    return run_dir


def stored(cell, cache_key, status=Status.PASS, run_id="20260101-000000-aaaaaa", **kw):
    return Record.for_cell(run_id, cell.key, cell.torch, "env", status, cell_id=cell.cell_id,
                           cache_key=cache_key, **kw)


def test_an_unchanged_cell_is_a_hit_and_is_adopted_with_its_origin(tmp_path):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    old = store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k, latency_ms={"median": 1.5})])
    (hit, source), = CellCache(reports).lookup({cell.cell_id: k}).values()
    assert source == old and hit.latency_ms.median == 1.5
    new = adopt(hit, source, "20260102-000000-aaaaaa", tmp_path / "new")
    assert (new.run_id, new.cached_from, new.cache_key) == ("20260102-000000-aaaaaa", "20260101-000000-aaaaaa", k)
    assert new.notes[-1].startswith("taken from run 20260101-000000-aaaaaa")
    # Taken again from the run that took it: still names the run that produced it, one note.
    again = adopt(new, tmp_path / "new", "20260103-000000-aaaaaa", tmp_path / "newer")
    assert again.cached_from == "20260101-000000-aaaaaa" and len(again.notes) == 1


@pytest.mark.parametrize("change", ["installed", "case source", "options", "latency protocol",
                                    "threads", "runtime", "tolerance", "provider"])
def test_a_changed_input_is_a_miss(tmp_path, change):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k)])
    changed = {
        "installed": lambda: key(tmp_path, installed=INSTALLED[:-1] + ["torch==2.13.1"]),
        "case source": lambda: key(tmp_path, rewrite=True, source="def tiny():\n    return 2\n"),
        "options": lambda: key(tmp_path, options={"dynamic": [False]}),
        "latency protocol": lambda: key(tmp_path, latency={"rel_ci": 0.02}),
        "threads": lambda: key(tmp_path, threads=2),
        "runtime": lambda: key(tmp_path, runtimes=[{"name": "ort-cpu", "version": "1.31.0"}]),
        "tolerance": lambda: key(tmp_path, cases=[{"target": "cases.py:tiny", "atol": 0.1}]),
        "provider": lambda: key(tmp_path, provider="docker"),
    }[change]
    cell2, k2 = changed()
    assert k2 and k2 != k
    assert CellCache(reports).lookup({cell2.cell_id: k2}) == {}


def test_a_case_without_a_source_hash_or_an_env_without_its_package_list_has_no_key(tmp_path):
    _, k = key(tmp_path, installed=[])
    assert k is None
    matrix, config, env_plan, cell = setup(tmp_path)
    context = KeyContext.for_run(matrix, {"harness": "0.1.0", "code": "c", "cases": {}}, "venv")
    assert context.key(cell, env_plan.env, EnvMarker.for_spec(env_plan.env, installed=INSTALLED)) is None


@pytest.mark.parametrize("status, error", [
    (Status.CRASH, "EnvironmentBuildError: environment torch2.13.0-cpu failed"),
    (Status.CRASH, "MemoryLimit: the worker's processes reached 2100 MiB"),
    (Status.CRASH, "Crash: worker killed by signal SIGSEGV"),
    (Status.TIMEOUT, "Timeout: no progress within 600 s"),
])
def test_environment_failures_crashes_timeouts_and_memory_kills_are_never_reused(tmp_path, status, error):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k, status, error=error)])
    assert CellCache(reports).lookup({cell.cell_id: k}) == {}


def test_unfinished_runs_are_not_reused_and_newer_runs_win(tmp_path):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k, latency_ms={"median": 1.0})])
    store_run(reports, "20260102-000000-aaaaaa", [stored(cell, k, run_id="20260102-000000-aaaaaa",
                                                         latency_ms={"median": 2.0})])
    store_run(reports, "20260103-000000-aaaaaa", [stored(cell, k, run_id="20260103-000000-aaaaaa",
                                                         latency_ms={"median": 3.0})], finished=False)
    (hit, _), = CellCache(reports).lookup({cell.cell_id: k}).values()
    assert hit.latency_ms.median == 2.0


def test_a_damaged_run_is_skipped_with_a_warning(tmp_path):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    good = store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k, latency_ms={"median": 1.0})])
    bad = store_run(reports, "20260102-000000-aaaaaa", [stored(cell, k, run_id="20260102-000000-aaaaaa")])
    warnings: list[str] = []
    cache = CellCache(reports, warn=warnings.append)
    cache.add_run(good)
    cache.add_run(bad)                      # the index now points at the newer run
    with open(bad / "results.jsonl", "a") as fh:
        fh.write('{"status": "weird"}\n')   # damaged after it was indexed
    assert cache.lookup({cell.cell_id: k}) == {}
    assert any("skips stored run 20260102-000000-aaaaaa" in w and "results.jsonl:2" in w for w in warnings)
    # Rebuilt without the index: the damaged run is skipped, the older one serves the cell.
    (reports / INDEX_FILE).unlink()
    (hit, source), = cache.lookup({cell.cell_id: k}).values()
    assert source == good and hit.latency_ms.median == 1.0


def test_a_broken_index_is_rebuilt_from_the_runs(tmp_path):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k)])
    (reports / INDEX_FILE).write_text("{not json")
    warnings: list[str] = []
    assert CellCache(reports, warn=warnings.append).lookup({cell.cell_id: k})
    assert "rebuilding" in warnings[0]
    assert k in json.loads((reports / INDEX_FILE).read_text())["keys"]


def test_runs_outside_the_store_are_not_indexed(tmp_path):
    cell, k = key(tmp_path)
    elsewhere = store_run(tmp_path / "elsewhere", "20260101-000000-aaaaaa", [stored(cell, k)])
    assert CellCache(tmp_path / "reports").add_run(elsewhere) == 0


def test_known_failure_marks_are_undone_for_the_current_xfail_list(tmp_path):
    cell, k = key(tmp_path)
    xfail = stored(cell, k, Status.XFAIL, error="E: x", reason="known (https://x)", signature="export:1")
    xpass = stored(cell, k, Status.XPASS, reason="listed as known failure but passes")
    assert (unannotated(xfail).status, xfail.reason, xfail.signature) == (Status.FAIL, None, None)
    assert (unannotated(xpass).status, xpass.reason) == (Status.PASS, None)


def test_adopt_links_the_log_and_bundle_into_the_new_run(tmp_path):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    old = reports / "runs" / "20260101-000000-aaaaaa"
    (old / "logs").mkdir(parents=True)
    (old / "logs" / "g.log").write_text("Traceback ...\n")
    bundle = old / "bundles" / cell.cell_id
    bundle.mkdir(parents=True)
    (bundle / "cell.json").write_text("{}")
    rec = stored(cell, k, Status.FAIL, error="E: x", log=str(old / "logs" / "g.log"), bundle=str(bundle),
                 repro=f"python -m harness.worker --job {bundle}/cell.json --print")
    new_dir = tmp_path / "new"
    new = adopt(rec, old, "20260102-000000-aaaaaa", new_dir)
    assert new.log == str(new_dir / "logs" / "cached" / "20260101-000000-aaaaaa" / "g.log")
    assert open(new.log).read() == "Traceback ...\n"
    assert new.bundle == str(new_dir / "bundles" / cell.cell_id) and (new_dir / "bundles" / cell.cell_id / "cell.json").exists()
    assert str(old) not in new.repro and new.bundle in new.repro


def test_a_changed_file_the_case_loaded_is_a_miss_and_an_unchanged_one_a_hit(tmp_path):
    """The key is known before the cell runs; what the case imported or opened only after: a
    stored record stands for the cell only while every file in its ``case_files`` is unchanged."""
    from harness.core.files import file_digest

    reports = tmp_path / "reports"
    helper, weights = tmp_path / "helper.py", tmp_path / "data" / "w.bin"
    helper.write_text("SCALE = 2\n")
    weights.parent.mkdir()
    weights.write_bytes(b"\x00" * 16)
    cell, k = key(tmp_path)
    files = {"helper.py": file_digest(helper), "data/w.bin": file_digest(weights)}
    store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k, case_files=files)])
    cache = CellCache(reports)
    assert set(cache.lookup({cell.cell_id: k}, tmp_path)) == {cell.cell_id} and not cache.stale
    helper.write_text("SCALE = 2  # a comment changes the bytes too\n")
    assert CellCache(reports).lookup({cell.cell_id: k}, tmp_path) == {}
    helper.write_text("SCALE = 2\n")
    weights.unlink()                      # a file that is gone counts as changed
    cache = CellCache(reports)
    assert cache.lookup({cell.cell_id: k}, tmp_path) == {}
    assert cache.stale == {cell.cell_id: ["data/w.bin"]}


def test_declared_data_files_are_part_of_the_key(tmp_path):
    (tmp_path / "vocab.txt").write_text("a b c\n")
    cell, before = key(tmp_path, cases=[{"target": "cases.py:tiny", "data_files": ["*.txt"]}])
    (tmp_path / "vocab.txt").write_text("a b c d\n")
    _, after = key(tmp_path, cases=[{"target": "cases.py:tiny", "data_files": ["*.txt"]}])
    _, undeclared = key(tmp_path)
    assert before and after and before != after and undeclared not in (before, after)


@pytest.mark.parametrize("wrong, says", [
    (lambda k: {"schema": 1, "updated": 1.0, "keys": {}}, "holds no entries, yet run 20260101-000000-aaaaaa finished"),
    (lambda k: {"schema": 1, "keys": {k: {"run": "20260101-000000-aaaaaa", "dir": "runs/20260101-000000-aaaaaa",
                                          "cell": "c"}}}, "'updated' is None"),
    (lambda k: {"schema": 1, "updated": 9e12, "keys": {k: "runs/20260101-000000-aaaaaa"}}, "is not a cell key"),
    (lambda k: {"schema": 1, "updated": 9e12, "keys": {k: {"dir": 5}}}, "is not a cell key"),
    (lambda k: {"schema": 1, "updated": 9e12, "keys": {k: {"run": "x", "dir": "../../elsewhere", "cell": "c"}}},
     "is not a cell key"),
    (lambda k: {"schema": 1, "updated": 9e12, "keys": {"not-a-key": {"run": "x", "dir": "runs/x", "cell": "c"}}},
     "'not-a-key' is not a cell key"),
])
def test_a_wrong_index_that_parses_is_rebuilt_with_a_warning(tmp_path, wrong, says):
    """An index of the right shape but wrong content was read as empty, silently: every cell
    missed. It is detected, said, and rebuilt from the runs."""
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    run = store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k)])
    meta = json.loads((run / "run.json").read_text())
    meta["ended"] = 1000.0
    (run / "run.json").write_text(json.dumps(meta))
    (reports / INDEX_FILE).write_text(json.dumps(wrong(k)))
    warnings: list[str] = []
    hits = CellCache(reports, warn=warnings.append).lookup({cell.cell_id: k})
    assert list(hits) == [cell.cell_id]
    assert len(warnings) == 1 and says in warnings[0] and "rebuilding it" in warnings[0], warnings
    rebuilt = json.loads((reports / INDEX_FILE).read_text())
    assert rebuilt["keys"][k]["dir"] == "runs/20260101-000000-aaaaaa"
    # The rebuilt index is read as it is: no warning, no second rebuild.
    warnings.clear()
    assert list(CellCache(reports, warn=warnings.append).lookup({cell.cell_id: k})) == [cell.cell_id]
    assert warnings == []


def test_an_empty_index_written_after_every_run_is_right(tmp_path):
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    run = store_run(reports, "20260101-000000-aaaaaa", [stored(cell, None)])   # nothing reusable
    meta = json.loads((run / "run.json").read_text())
    meta["ended"] = meta["started"]
    (run / "run.json").write_text(json.dumps(meta))
    warnings: list[str] = []
    assert CellCache(reports, warn=warnings.append).lookup({cell.cell_id: k}) == {}
    assert json.loads((reports / INDEX_FILE).read_text())["keys"] == {}
    assert CellCache(reports, warn=warnings.append).lookup({cell.cell_id: k}) == {}
    assert warnings == []


def test_a_new_store_s_first_run_warns_of_nothing(tmp_path):
    """The index is written empty while a new store's first run goes on; that run finishing after
    it used to be read as a wrong index ("holds no entries ... rebuilding it") on every new store."""
    reports = tmp_path / "reports"
    cell, k = key(tmp_path)
    run = store_run(reports, "20260101-000000-aaaaaa", [stored(cell, k)], finished=False)
    warnings: list[str] = []
    cache = CellCache(reports, warn=warnings.append)
    assert cache.lookup({cell.cell_id: k}) == {}          # the run under way: nothing finished yet
    assert json.loads((reports / INDEX_FILE).read_text())["keys"] == {}
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "finished": True, "ended": meta["started"] + 3600}))
    assert cache.add_run(run) == 1
    assert warnings == [], warnings
    assert list(CellCache(reports, warn=warnings.append).lookup({cell.cell_id: k})) == [cell.cell_id]
    assert warnings == []
