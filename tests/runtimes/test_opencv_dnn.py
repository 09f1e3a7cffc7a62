"""OpenCV DNN end to end: verdicts agree with plain cv2.dnn, refusals keep OpenCV's words."""
from __future__ import annotations

import json

import pytest
from edge_helpers import compare, direct_verdicts
from helpers import env_python, run_matrix

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cv_run(tmp_path_factory):
    return run_matrix(tmp_path_factory, "opencv", "opencv.yaml")


@pytest.fixture(scope="module")
def cv_records(cv_run):
    from harness.core.record import read_records

    return read_records(cv_run / "results.jsonl")


def by(records, runtime, case, exporter):
    return next(r for r in records if (r.runtime, r.case, r.exporter) == (runtime, case, exporter))


def test_opencv_refuses_a_file_onnx_runtime_runs_with_its_own_message(cv_records):
    # The TorchScript export of repeat_interleave keeps a dynamic Shape: OpenCV's importer
    # cannot read it; ONNX Runtime runs the very same file (same environment, same export).
    cv = by(cv_records, "opencv-dnn", "repeat_interleave", "torchscript")
    ort = by(cv_records, "ort-cpu", "repeat_interleave", "torchscript")
    assert ort.status.value == "pass"
    assert (cv.status.value, cv.stage) == ("fail", "load")
    assert cv.error.startswith("OpenCvError: Node [Shape@ai.onnx]") and "isDynamicShape" in cv.error
    assert "/io/opencv" not in cv.error.splitlines()[0]          # source locations stripped


def test_opencv_passes_multi_output_and_int64_outputs_with_latency(cv_records):
    lstm = by(cv_records, "opencv-dnn", "lstm", "dynamo")
    assert lstm.status.value == "pass", lstm.error
    assert len(lstm.graph["runtime_facts"]["outputs_forwarded"]) == 3
    assert lstm.parity.max_abs < 1e-4
    assert by(cv_records, "opencv-dnn", "int_concat", "dynamo").status.value == "pass"
    assert lstm.versions["runtime"] == "5.0.0.93"
    assert lstm.latency_ms.median > 0 and lstm.latency_ms.binding_overhead_ms > 0   # the binding overhead: cv2 on an Identity graph


def test_opencv_verdicts_match_a_direct_cv2_run(cv_run, cv_records, tmp_path):
    meta = json.loads((cv_run / "run.json").read_text())
    direct = direct_verdicts(cv_records, "opencv-dnn", env_python(meta, "2.13.0"), tmp_path)
    assert compare(cv_records, "opencv-dnn", direct) == []
    assert any(d["status"] == "fail" for d in direct.values())     # the refusal is OpenCV's too
