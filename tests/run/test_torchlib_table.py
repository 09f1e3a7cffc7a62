"""The worker keeps torchlib's table between dynamo exports: the same table as onnxscript makes,
made again when torchlib's registry changes, and gone when forgotten. That the files are the
bytes a plain export writes is proved on every release by ``tests/run/test_capture_reuse.py``."""
from __future__ import annotations

import pytest

from harness.worker import group_process as fresh

pytest.importorskip("onnxscript")


def _rows(table: list) -> list[tuple]:
    return [(m.qualified_name, id(m.function), m.domain, m.name, m.is_complex) for m in table]


@pytest.fixture()
def apis():
    module = fresh._torchlib_apis()
    original = getattr(module.get_torchlib_ops, "harness_original", module.get_torchlib_ops)
    yield module, original
    fresh.forget_torchlib_table()
    assert module.get_torchlib_ops is original


def test_the_kept_table_is_onnxscripts_and_follows_its_registry(apis):
    module, original = apis
    plain = _rows(original())
    assert fresh.keep_torchlib_table() and module.get_torchlib_ops is not original
    first, second = module.get_torchlib_ops(), module.get_torchlib_ops()
    assert _rows(first) == _rows(second) == plain and first is not second
    assert fresh.keep_torchlib_table() and module.get_torchlib_ops.harness_original is original  # once

    from onnxscript.function_libs.torch_lib import registration

    borrowed = first[0].function
    registration.default_registry.register(borrowed, "harness_test::borrowed")
    try:
        grown = _rows(module.get_torchlib_ops())
        assert grown == _rows(original()) and len(grown) == len(plain) + 1
        assert ("harness_test::borrowed", id(borrowed)) in {(r[0], r[1]) for r in grown}
    finally:
        registration.default_registry._registry.pop("harness_test::borrowed")
    assert _rows(module.get_torchlib_ops()) == plain


def test_forgetting_gives_torch_onnx_the_plain_table(apis):
    module, original = apis
    fresh.keep_torchlib_table()
    fresh.forget_torchlib_table()
    assert module.get_torchlib_ops is original


def test_kept_signatures_are_torch_onnxs_own_and_forgotten_with_the_table(apis):
    """The registry built with the signatures kept holds, for every aten op, the same functions
    with signatures equal to those a plain build infers; a second build takes them from the keep."""
    from torch.onnx._internal.exporter import _registration

    def entries(registry) -> dict:
        out = {}
        for target, metas in registry.functions.items():
            out[str(target)] = [(id(m.onnx_function), repr(m.signature)) for m in metas]
        return out

    fresh.forget_torchlib_table()
    found = fresh._signature_api()
    if found is None:
        pytest.skip("this torch.onnx infers no signatures at registry builds")
    plain = entries(_registration.ONNXRegistry.from_torchlib())
    assert fresh.keep_torchlib_table() and fresh._kept_signature(found) is not None
    first, second = _registration.ONNXRegistry.from_torchlib(), _registration.ONNXRegistry.from_torchlib()
    assert entries(first) == entries(second) == plain and len(plain) > 100
    shared = [(a.signature is b.signature) for t in first.functions for a, b in zip(first.functions[t], second.functions[t])
              if a.signature is not None]
    assert shared and all(shared)
    fresh.forget_torchlib_table()
    assert fresh._kept_signature(found) is None
    third = _registration.ONNXRegistry.from_torchlib()
    assert entries(third) == plain
    # torch's own functions carry a signature made once at import; onnxscript's are inferred again.
    again = [(a.signature is b.signature) for t in first.functions
             for a, b in zip(first.functions[t], third.functions[t]) if a.signature is not None]
    assert len(again) == len(shared) and again.count(False) > len(again) // 2
