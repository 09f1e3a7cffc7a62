"""Second shapes from any example (empty dims, batch 1), the matrix's own failures as an `error`
record, and what a second-shape failure confirms per dim; in-process with the test torch."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import TESTS

from harness.core.job import CellJob, ExportGroup, Job, LatencyProtocol
from harness.core.record import Record
from harness.core.status import Status
from harness.worker.inputs import CaseInputs, resolve_dims
from harness.worker.main import run_job
from harness.worker.parity import second_shape_inputs, second_size

DECODING = TESTS / "cases" / "decoding.py"


def test_the_size_rule_grows_every_example_size():
    assert [second_size(n) for n in (0, 1, 2, 7)] == [1, 3, 3, 8]
    with pytest.raises(ValueError):
        second_size(-1)


def _case(fn):
    import importlib.util

    spec = importlib.util.spec_from_file_location("decoding_cases", DECODING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, args, dims = getattr(module, fn)()
    inputs = CaseInputs(args, model=model)
    return model, inputs, resolve_dims(dims, inputs)


def test_an_empty_cache_grows_to_one_entry_that_eager_accepts():
    model, inputs, dims = _case("empty_cache")
    grown = second_shape_inputs(inputs, dims)
    shapes = {n: list(v.shape) for n, v in grown.feeds().items()}
    assert shapes == {"input_0": [3, 4], "input_1": [3, 2, 1, 16], "input_2": [3, 2, 1, 16]}
    # fresh entries of unit scale where the example had none, not zeros
    assert float(grown.args[1].std()) > 0.3
    logits, key, _value = grown.call(model)
    assert list(logits.shape) == [3, 4, 64] and list(key.shape) == [3, 2, 5, 16]


def test_an_empty_integer_dim_grows_with_zeros():
    ids = torch.zeros(2, 0, dtype=torch.int64)
    grown = second_shape_inputs((ids,), {0: {0: "batch", 1: "seq"}})
    assert grown[0].dtype == torch.int64 and list(grown[0].shape) == [3, 1] and int(grown[0].abs().sum()) == 0


def _job(tmp_path, case_file, fn, exporter="torchscript", opset=17):
    group = ExportGroup("g", fn, f"{case_file}:{fn}", exporter, opset, cells=(CellJob("c", "ort-cpu", "ort-cpu"),))
    return Job(run_id="r", run_dir=str(tmp_path / "run"), env="env", groups=(group,), base_dir=str(tmp_path),
               bundles=True, latency=LatencyProtocol(enabled=False))


def _one_record(job) -> Record:
    events: list[dict] = []
    run_job(Job.from_dict(json.loads(job.to_json())), events.append)
    return next(Record.from_dict(e["record"]) for e in events if e["event"] == "record")


def test_the_first_decoding_step_is_judged_not_refused(tmp_path):
    """The issue's model: a cache of past length 0 failed every cell at reference (the matrix
    could not grow the empty dim); now it passes, checked at a second shape with past 1."""
    rec = _one_record(_job(tmp_path, DECODING, "empty_cache"))
    assert (rec.status, rec.stage) == (Status.PASS, None), rec.error
    assert rec.parity.extra["second_shape"] == {"checked": True, "source": "generated"}
    assert rec.parity.shapes[1]["inputs"]["input_1"] == [3, 2, 1, 16]


BF16 = """
import torch

class Half(torch.nn.Module):
    def forward(self, x):
        return (x * 2).to(torch.bfloat16)

def bf16_output():
    return Half(), (torch.randn(2, 4),), {0: {0: "batch"}}
"""


def test_a_failure_of_the_matrix_own_code_is_an_error_never_a_verdict(tmp_path):
    """The model runs in eager; the matrix cannot read a bfloat16 output into numpy. That is the
    matrix's fault: status error, at the stage it happened, with the reason, no blame, no bundle."""
    case = tmp_path / "bf16.py"
    case.write_text(BF16)
    rec = _one_record(_job(tmp_path, case, "bf16_output"))
    assert (rec.status, rec.stage) == (Status.ERROR, "reference")
    assert rec.error.startswith("OwnError: the matrix's own code failed reading the model's outputs")
    assert "BFloat16" in rec.error
    assert "this is the matrix's fault" in rec.reason
    assert rec.blame is None and rec.bundle is None
    assert not rec.status.is_failure and not rec.status.attempted and not rec.status.passed
    assert not (tmp_path / "run" / "bundles" / "c").exists()


SHAPE_BAKED = """
import torch

class Baked(torch.nn.Module):
    def forward(self, x, y):
        b, s, h = x.shape
        return x.reshape(int(b) * int(s), int(h)).sum(-1), y * 2

def baked():
    return Baked(), (torch.randn(2, 5, 8), torch.randn(2, 3)), {0: {0: "batch", 1: "seq"}, 1: {0: "batch"}}
"""


def test_a_second_shape_failure_names_the_dim_that_fails_alone(tmp_path):
    """TorchScript bakes batch * seq: growing seq alone, or batch alone, is rejected; the error
    names both, each probed with eager first (the inputs are consistent there)."""
    case = tmp_path / "baked.py"
    case.write_text(SHAPE_BAKED)
    rec = _one_record(_job(tmp_path, case, "baked"))
    assert (rec.status, rec.stage) == (Status.FAIL, "run"), rec.error
    assert "rejected when growing 'batch' (input_0 dim 0, input_1 dim 0), 'seq' (input_0 dim 1)" in rec.error


def test_dim_outcomes_skip_inputs_eager_refuses():
    """A dim that only grows together with another (eager refuses it alone) is not a culprit."""
    from types import SimpleNamespace

    from harness.worker.second_shape import dim_outcomes

    class Pairs(torch.nn.Module):
        def forward(self, x, y):
            return x + y              # x and y share their length only when both grow

    x, y = torch.randn(4), torch.randn(4)
    inputs = CaseInputs((x, y), model=Pairs())
    dims = resolve_dims({0: {0: "a"}, 1: {0: "b"}}, inputs)

    class Refuses:
        def infer(self, feeds):
            raise RuntimeError("the runtime refuses any other size")

    ctx = SimpleNamespace(dims=dims, spec=SimpleNamespace(example=inputs, model=Pairs(), atol=1e-4, rtol=1e-3))
    assert dim_outcomes(ctx, Refuses(), ["input_0", "input_1"], judge=True) == {"a": "eager-rejects",
                                                                                "b": "eager-rejects"}


def test_error_records_round_trip_and_are_not_attempts():
    from harness.core.cell import CellKey
    from harness.core.record import count_by_status

    rec = Record.for_cell("r", CellKey("m", "dynamo", 18, "ort-cpu"), "2.13.0", "env", Status.ERROR,
                          stage="reference", error="OwnError: x", reason="this is the matrix's fault")
    back = Record.from_dict(json.loads(rec.to_json()))
    assert back.status is Status.ERROR and back.stage == "reference"
    assert count_by_status([back])["error"] == 1


EAGER_FAILS = """
import torch

class Broken(torch.nn.Module):
    def forward(self, x):
        return x.index_select(1, torch.tensor([5]))   # out of range at the example

def broken():
    return Broken(), (torch.randn(2, 3),), {0: {0: "batch"}}
"""


def test_a_model_that_fails_in_eager_gets_no_repro_that_loads_missing_inputs(tmp_path):
    """A genuine failure at reference (the model's own): a bundle, but no repro.py loading an
    inputs.npz that was never written; repro.json says why."""
    case = tmp_path / "broken.py"
    case.write_text(EAGER_FAILS)
    rec = _one_record(_job(tmp_path, case, "broken"))
    assert (rec.status, rec.stage) == (Status.FAIL, "reference") and rec.blame.party == "model-code"
    bundle = tmp_path / "run" / "bundles" / "c"
    assert not (bundle / "repro.py").exists() and not (bundle / "inputs.npz").exists()
    assert "failed at reference" in json.loads((bundle / "repro.json").read_text())["why"]
