from __future__ import annotations

import numpy as np
import pytest

from harness.run.parity import ParityError, compare_outputs


def test_within_tolerance_reports_numbers():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    stats = compare_outputs([a], [a + 1e-6], atol=1e-4, rtol=1e-3, label="x")
    assert 0 < stats["max_abs"] < 2e-6
    assert stats["outputs"][0]["worst_index"] is not None


def test_beyond_tolerance_names_worst_element():
    a = np.zeros((2, 3), dtype=np.float32)
    b = a.copy()
    b[1, 2] = 0.5
    with pytest.raises(ParityError, match=r"max_abs=0.5 at \[1, 2\]"):
        compare_outputs([a], [b], atol=1e-4, rtol=1e-3, label="x")


def test_shape_dtype_count_nan():
    a = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ParityError, match=r"shape \[3, 2\] != eager \[2, 3\]"):
        compare_outputs([a], [a.reshape(3, 2)], 1e-4, 1e-3, "x")
    with pytest.raises(ParityError, match="dtype"):
        compare_outputs([a], [a.astype(np.float64)], 1e-4, 1e-3, "x")
    with pytest.raises(ParityError, match="2 outputs"):
        compare_outputs([a], [a, a], 1e-4, 1e-3, "x")
    b = a.copy()
    b[0, 0] = np.nan
    with pytest.raises(ParityError, match="NaN"):
        compare_outputs([a], [b], 1e-4, 1e-3, "x")
    # NaN where eager has NaN too is agreement, not drift
    compare_outputs([b], [b.copy()], 1e-4, 1e-3, "x")


def test_second_shape_differs_in_every_dynamic_dim():
    torch = pytest.importorskip("torch")
    from harness.run.parity import second_shape_inputs

    ids = torch.tensor([[5, 6, 7]])
    mask = torch.tensor([[True, True, False]])
    x = torch.randn(1, 3, 4)
    out = second_shape_inputs((x, ids, mask), {0: {0: "b", 1: "s"}, 1: {0: "b", 1: "s"}, 2: {0: "b", 1: "s"}})
    assert out[0].shape[:2] == out[1].shape == out[2].shape
    assert out[0].shape[0] != 1 and out[0].shape[1] != 3 and out[0].shape[2] == 4
    assert set(out[1].flatten().tolist()) <= {5, 6, 7}   # ids stay valid ids
    assert out[2].dtype == torch.bool
