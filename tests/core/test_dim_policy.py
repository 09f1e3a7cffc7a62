"""The dim_policy option: absent by default (ids, labels and stored options as before), a suffix
and a label when set, validated."""
from __future__ import annotations

import pytest

from harness.core.cell import CellKey, ExportOptions


def test_default_policy_leaves_ids_labels_and_stored_options_unchanged():
    opts = ExportOptions()
    assert opts.dim_policy is None
    assert opts.to_dict() == {"constant_folding": True, "dynamic": True, "precision": "fp32"}
    key = CellKey("conv_bn", "dynamo", 13, "ort-cpu", opts)
    assert key.cell_id("2.13.0") == "torch2.13.0-conv_bn-dynamo-op13-ort-cpu"
    assert key.name == "conv_bn · dynamo · op13 · ort-cpu"


def test_a_policy_names_the_cell_and_round_trips():
    opts = ExportOptions(dim_policy="auto")
    assert opts.suffix == "-dim-auto" and opts.label == "dim-auto"
    assert ExportOptions(dynamic=False, dim_policy="named").label == "static,dim-named"
    assert ExportOptions.from_dict(opts.to_dict()) == opts
    assert ExportOptions.from_dict({"dim_policy": None}) == ExportOptions()
    key = CellKey("m", "dynamo", 18, "ort-cpu", opts)
    assert key.cell_id("2.6.0") == "torch2.6.0-m-dynamo-op18-dim-auto-ort-cpu"
    assert key.axes["dim_policy"] == "auto"


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="dim_policy 'fixed'"):
        ExportOptions(dim_policy="fixed")
