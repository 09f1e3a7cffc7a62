"""Runtime releases per exported file (harness.run.floors, harness.envs.runtime_only): the
bisection, the reasons, the matrix keys, and the gate's deployment targets. No install here; the
real-wheel run is tests/run/test_floors_e2e.py."""
from __future__ import annotations


import pytest
from helpers import TESTS, run_harness

from harness.core.cell import CellKey
from harness.core.record import Record
from harness.envs.runtime_only import RuntimeRelease
from harness.gate.compare import Settings, Verdict, block_on_deploy, compare_cell
from harness.matrix.config import ConfigError, load_matrix
from harness.run.floors import find_floor, floor_reason
from harness.run.runtime_probe import ProbeResult

IR_ERROR = ("Fail: [ONNXRuntimeError] : 1 : FAIL : Load model from g.onnx failed:Unsupported "
            "model IR version: 10, max supported IR version: 9")
RELEASES = ["1.14.1", "1.15.1", "1.16.3", "1.17.3", "1.18.1", "1.19.2", "1.20.1", "1.21.1"]


def _works_from(first_ok: str, calls: list[str]):
    def works(rel: RuntimeRelease) -> ProbeResult:
        calls.append(rel.version)
        if RELEASES.index(rel.version) >= RELEASES.index(first_ok):
            return ProbeResult("pass")
        return ProbeResult("fail", stage="load", error=IR_ERROR)
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
    bad = ProbeResult("fail", stage="parity", error="example shape: output 0 differs")
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
