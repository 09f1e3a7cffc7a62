"""Runtime releases per exported file (harness.run.post.runtime_floors, harness.envs.runtime_only): the
bisection, the reasons, the matrix keys, and the gate's deployment targets. No install here; the
real-wheel run is tests/run/test_floors_e2e.py."""
from __future__ import annotations

import json

import pytest
from helpers import TESTS, run_harness

from harness.core.cell import CellKey
from harness.core.passes import gather
from harness.core.record import Record
from harness.core.wire import ReleaseCheck
from harness.envs.runtime_only import RuntimeRelease
from harness.gate.compare import Settings, Verdict, block_on_deploy, compare_cell, deploy_problem
from harness.matrix.config import ConfigError, load_matrix
from harness.run.post.runtime_floors import ReleaseProber, RuntimeAxes, annotate_records, find_floor, floor_reason

IR_ERROR = ("Fail: [ONNXRuntimeError] : 1 : FAIL : Load model from g.onnx failed:Unsupported "
            "model IR version: 10, max supported IR version: 9")
RELEASES = ["1.14.1", "1.15.1", "1.16.3", "1.17.3", "1.18.1", "1.19.2", "1.20.1", "1.21.1"]


def _works_from(first_ok: str, calls: list[str]):
    def works(rel: RuntimeRelease) -> ReleaseCheck:
        calls.append(rel.version)
        if RELEASES.index(rel.version) >= RELEASES.index(first_ok):
            return ReleaseCheck("pass")
        return ReleaseCheck("fail", stage="load", error=IR_ERROR)
    return works


@pytest.mark.parametrize("first_ok", RELEASES)
def test_bisection_finds_the_oldest_working_release_in_few_tries(first_ok):
    calls: list[str] = []
    releases = [RuntimeRelease("ort-cpu", v) for v in reversed(RELEASES)]   # any order given
    floor = find_floor(releases, _works_from(first_ok, calls), {})
    assert floor["oldest_ok"] == first_ok
    i = RELEASES.index(first_ok)
    assert floor["first_bad"] == (RELEASES[i - 1] if i else None)
    assert len(set(calls)) == len(calls) <= 5     # log2(8) + the newest + the one below the floor
    if i:
        assert floor["reason"] == f"needs onnxruntime >= {first_ok}: IR version 10 ({RELEASES[i - 1]} reads up to 9)"


def test_no_listed_release_working_says_so():
    floor = find_floor([RuntimeRelease("ort-cpu", v) for v in RELEASES[:3]],
                       _works_from("1.21.1", []), {})
    assert floor["oldest_ok"] is None and floor["first_bad"] == "1.16.3"
    assert floor["reason"].startswith("no listed onnxruntime release works: IR version 10")


def test_a_reason_without_an_ir_message_quotes_the_runtime():
    bad = ReleaseCheck("fail", stage="parity", error="example shape: output 0 differs")
    assert floor_reason("openvino", "2025.1.0", "2024.6.0", bad, {}) == \
        "needs openvino >= 2025.1.0: parity fails on 2024.6.0: example shape: output 0 differs"


def test_old_onnxruntime_gets_numpy_below_2():
    assert "numpy<2" in RuntimeRelease("ort-cpu", "1.18.1").packages()
    assert "numpy" in RuntimeRelease("ort-cpu", "1.20.1").packages()
    assert not any(p.startswith("torch") for p in RuntimeRelease("openvino", "2025.1.0").packages())


BASE = "torch: ['2.13.0']\nexporters: [dynamo]\nopsets: [18]\nruntimes: [ort-cpu]\ncases: [conv_bn]\n"


@pytest.mark.parametrize("extra, key, expected", [
    ("runtime_floor: {ort-cuda: [1.18.1]}", "runtime_floor.ort-cuda", "runtime-only environment can hold"),
    ("runtime_versions: {openvino: [2025.1.0]}", "runtime_versions.openvino", "this matrix's 'runtimes'"),
    ("runtime_floor: {ort-cpu: []}", "runtime_floor.ort-cpu", "at least one release"),
    ("runtime_floor: {ort-cpu: [1.18.1, 1.18.1]}", "runtime_floor.ort-cpu", "each release once"),
    ("deploy: {ort-cpu: 'latest'}", "deploy.ort-cpu", "a release of the runtime's package"),
])
def test_bad_runtime_keys_name_file_and_key(tmp_path, extra, key, expected):
    path = tmp_path / "matrix.yaml"
    path.write_text(BASE + extra + "\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert f"key '{key}" in str(err.value) and expected in str(err.value)


def test_bad_runtime_key_exits_2_before_anything_is_built(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(BASE + "runtime_floor: {tensorrt: [10.0.1]}\n")
    proc = run_harness("plan", "--config", str(path), cwd=TESTS.parent, check=False)
    assert proc.returncode == 2 and "runtime_floor.tensorrt" in proc.stderr


def test_keys_left_unset_keep_the_matrix_hash(tmp_path):
    from harness.matrix.config import matrix_hash

    (tmp_path / "a.yaml").write_text(BASE)
    (tmp_path / "b.yaml").write_text(BASE + "runtime_floor: {}\n")
    (tmp_path / "c.yaml").write_text(BASE + "runtime_floor: {ort-cpu: [1.18.1]}\n")
    a, b, c = (matrix_hash(load_matrix(tmp_path / f"{n}.yaml")) for n in "abc")
    assert a == b != c


# -- the gate's deployment targets ----------------------------------------------------------------
def _rec(torch: str, deploy_ok: bool, floor: str) -> Record:
    dep = {"version": "1.16.3", "status": "pass" if deploy_ok else "fail",
           "stage": None if deploy_ok else "load", "error": None if deploy_ok else IR_ERROR}
    reason = None if floor == "1.16.3" else f"needs onnxruntime >= {floor}: IR version 10 (1.16.3 reads up to 9)"
    return Record(run_id=f"r{torch}", case="c", torch=torch, exporter="dynamo", opset=18,
                  runtime="ort-cpu", status="pass", parity={"max_abs": 1e-7, "atol": 1e-4},
                  graph={"deploy": {"ort-cpu": dep},
                         "runtime_floor": {"ort-cpu": {"oldest_ok": floor, "first_bad": None, "reason": reason}}})


def _gate(base: Record, cand: Record):
    cell = compare_cell(CellKey("c", "dynamo", 18, "ort-cpu"), base, cand, Settings(), True)
    block_on_deploy(cell)
    return cell


def test_a_file_the_deployed_release_no_longer_loads_blocks():
    cell = _gate(_rec("2.6.0", True, "1.16.3"), _rec("2.13.0", False, "1.18.1"))
    assert cell.verdict is Verdict.NEW_FAILURE and cell.verdict.mark == "!"
    assert cell.detail == ("deployed runtime: needs onnxruntime >= 1.18.1: IR version 10 (1.16.3 reads "
                           "up to 9); you deploy onnxruntime 1.16.3")


def test_a_raised_floor_the_deployed_release_meets_is_information():
    base = _rec("2.6.0", True, "1.16.3")
    cand = _rec("2.13.0", True, "1.18.1")
    cand.graph["deploy"]["ort-cpu"]["version"] = "1.20.1"
    cell = _gate(base, cand)
    assert cell.verdict is Verdict.UNCHANGED and not cell.verdict.blocking
    assert cell.notes == ["onnxruntime floor raised 1.16.3 → 1.18.1 (needs onnxruntime >= 1.18.1: "
                          "IR version 10 (1.16.3 reads up to 9))"]


def test_a_deployed_release_that_failed_on_both_sides_is_no_new_regression():
    cell = _gate(_rec("2.6.0", False, "1.18.1"), _rec("2.13.0", False, "1.18.1"))
    assert cell.verdict is Verdict.UNCHANGED


# -- releases that could not be installed, and the ones a run could not try ---------------------------
def _works_except(first_ok: str, not_installed: set[str], calls: list[str]):
    works = _works_from(first_ok, calls)

    def probe(rel: RuntimeRelease) -> ReleaseCheck:
        if rel.version in not_installed:
            calls.append(rel.version)
            return ReleaseCheck("fail", stage="install", error=f"No solution found: onnxruntime=={rel.version}")
        return works(rel)
    return probe


@pytest.mark.parametrize("missing", [{"1.17.3"}, {"1.21.1"}, {"1.21.1", "1.17.3", "1.14.1"}])
def test_a_release_that_cannot_be_installed_says_nothing_about_the_file(missing):
    """An install failure is not "this release cannot read the file": it is never a first_bad, a
    bogus newest release never hides the floor, and it is named in ``not_installed``."""
    calls: list[str] = []
    floor = find_floor([RuntimeRelease("ort-cpu", v) for v in RELEASES], _works_except("1.18.1", missing, calls), {})
    assert (floor["oldest_ok"], floor["first_bad"]) == ("1.18.1", "1.16.3" if "1.17.3" in missing else "1.17.3")
    assert floor["reason"].startswith("needs onnxruntime >= 1.18.1: IR version 10")
    assert set(floor["not_installed"]) <= missing and floor["listed"] == RELEASES
    assert all(floor["tried"][v].startswith("install: ") for v in floor["not_installed"])


def test_no_release_installable_is_no_floor_and_no_first_bad():
    floor = find_floor([RuntimeRelease("ort-cpu", v) for v in RELEASES[:2]],
                       _works_except("1.14.1", set(RELEASES[:2]), []), {})
    assert floor["oldest_ok"] is None and floor["first_bad"] is None
    assert floor["reason"] == "no listed onnxruntime release could be installed: the file was tried on none"


class FakeProber(ReleaseProber):
    """Answers as ONNX Runtime would for an IR 10 file; 1.17.9 cannot be installed."""

    def __init__(self) -> None:
        super().__init__(envs=object())

    def _probe(self, spools, release):
        if release.version == "1.17.9":
            return [ReleaseCheck("fail", stage="install", error="no version of onnxruntime==1.17.9")] * len(spools)
        ok = release.version >= "1.18.1"
        return [ReleaseCheck("pass") if ok else ReleaseCheck("fail", stage="load", error=IR_ERROR)] * len(spools)


def _spooled(tmp_path, cid: str, outputs: bool = True):
    spool = tmp_path / "spool" / cid
    spool.mkdir(parents=True)
    (spool / "m.onnx").write_bytes(cid.encode())
    (spool / "spool.json").write_text(json.dumps({"onnx": "m.onnx", "inputs": [], **({"outputs": 1} if outputs else {})}))
    rec = Record(run_id="r", case=cid, torch="2.13.0", exporter="dynamo", opset=18, runtime="ort-cpu",
                 status="pass", cell_id=cid, graph={"ir_version": 10, "opset_imports": {"ai.onnx": 18}})
    return rec, spool


def test_releases_that_could_not_be_tried_are_the_records_passes_not_run(tmp_path):
    axes = RuntimeAxes(versions={"ort-cpu": ["1.17.9", "1.20.1"]}, floor={"ort-cpu": ["1.16.3", "1.17.9", "1.18.1"]},
                       deploy={"ort-cpu": "1.17.9"})
    good, spool = _spooled(tmp_path, "good")
    no_outputs, spool2 = _spooled(tmp_path, "no_outputs", outputs=False)
    stored = Record(run_id="r", case="stored", torch="2.13.0", exporter="dynamo", opset=18, runtime="ort-cpu",
                    status="pass", cell_id="stored", cached_from="r0")
    records = [good, no_outputs, stored]
    annotate_records(records, {"good": spool, "no_outputs": spool2}, {r.cell_id: "ort-cpu" for r in records},
                     axes, FakeProber())
    assert good.graph["runtime_floor"]["ort-cpu"]["oldest_ok"] == "1.18.1"
    assert good.graph["runtime_floor"]["ort-cpu"]["first_bad"] == "1.16.3"
    assert good.graph["onnx_file"]["ir_version"] == 10      # as the worker read it: no onnx here
    assert set(good.passes_not_run) == {"runtime_versions", "runtime_floor", "deploy"}
    assert good.passes_not_run["deploy"].startswith("onnxruntime 1.17.9 could not be installed")
    assert set(no_outputs.passes_not_run) == {"runtime_versions", "runtime_floor", "deploy"}
    assert "eager's outputs were not kept" in no_outputs.passes_not_run["deploy"]
    assert "taken from run r0, which did not try it" in stored.passes_not_run["deploy"]
    gaps = gather(records)
    assert [(g.name, g.cells) for g in gaps if g.reason.startswith("onnxruntime 1.17.9")] == \
        [("runtime_floor", 1), ("runtime_versions", 1), ("deploy", 1)]


def test_runtime_releases_have_one_spelling(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(BASE + "runtime_versions: {ort-cpu: ['1.18.1.0']}\nruntime_floor: {ort-cpu: ['v1.18.1', '1.16']}\n"
                           "deploy: {ort-cpu: '1.18.1'}\n")
    m = load_matrix(path)
    assert m.runtime_versions == {"ort-cpu": ["1.18.1"]} and m.runtime_floor == {"ort-cpu": ["1.18.1", "1.16.0"]}
    names = {RuntimeRelease("ort-cpu", v).spec("3.11").name for v in [*m.runtime_versions["ort-cpu"], m.deploy["ort-cpu"]]}
    assert len(names) == 1                                 # one environment for the three spellings
    path.write_text(BASE + "runtime_floor: {ort-cpu: ['1.18.1', '1.18.1.0']}\n")
    with pytest.raises(ConfigError, match="each release once"):
        load_matrix(path)


def test_a_deployed_release_that_could_not_be_installed_is_not_a_regression_but_unknown():
    base, cand = _rec("2.6.0", True, "1.16.3"), _rec("2.13.0", False, "1.16.3")
    cand.graph["deploy"]["ort-cpu"].update(stage="install", error="no version of onnxruntime==1.16.3")
    cell = compare_cell(CellKey("c", "dynamo", 18, "ort-cpu"), base, cand, Settings(), True)
    block_on_deploy(cell, {"ort-cpu": "1.16.3"})
    assert cell.verdict is Verdict.NOT_COMPARABLE and "could not be installed" in cell.detail
    assert deploy_problem([cell]).startswith("the deployed runtime release was not tried on 1 passing cell(s)")
    other = compare_cell(CellKey("c", "dynamo", 18, "ort-cpu"), base, _rec("2.13.0", True, "1.16.3"), Settings(), True)
    block_on_deploy(other, {"ort-cpu": "1.20.1"})    # tried on 1.16.3, deployed is 1.20.1
    assert other.verdict is Verdict.NOT_COMPARABLE and "1.20.1 was not tried" in other.detail
