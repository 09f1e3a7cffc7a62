"""The quality judge of quantized and half-precision pipelines (harness.worker.parity.quality,
judge_quality), in-process."""
from __future__ import annotations

import numpy as np

from harness.worker.parity import judge_quality, quality

JUDGE = {"class": "int8", "cosine": 0.99, "top1": 0.9}


def test_quality_of_a_close_and_of_a_far_output():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 10)).astype(np.float32)
    close = ref + 1e-3 * rng.standard_normal(ref.shape).astype(np.float32)
    q = quality([ref], [close])
    assert q["cosine"] > 0.9999 and q["top1"] == 1.0
    assert judge_quality(q, JUDGE, "example shape") is None
    shuffled = ref[:, ::-1].copy()
    q = quality([ref], [shuffled])
    assert q["cosine"] < 0.9 and q["top1"] < 0.9
    miss = judge_quality(q, JUDGE, "example shape")
    assert miss.startswith("example shape: cosine") and "int8 threshold 0.99" in miss


def test_top1_only_where_there_is_a_class_axis_and_nonfinite_disagrees():
    ref = np.ones((4, 1), np.float32)
    assert quality([ref], [ref])["top1"] is None
    bad = ref.copy()
    bad[0, 0] = np.nan
    assert quality([ref], [bad])["cosine"] == -1.0
    assert quality([], [])["cosine"] is None
