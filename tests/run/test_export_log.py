"""What torch says while exporting (harness.worker.export_log): messages as torch 2.6 and 2.9.1
write them (copied from their runs of tests/cases/decoding.py). Real exports on 2.6.0 and 2.13.0
are in tests/run/test_decoding.py."""
from __future__ import annotations

import logging

import torch

from harness.worker.export_log import SHAPES_LOGGER, ExportLog, leaf_key, remedy
from harness.worker.inputs import CaseInputs, resolve_dims


class Step(torch.nn.Module):
    def forward(self, input_ids, past_key, past_value):
        return input_ids * 2, past_key + 1, past_value - 1


def _inputs(past: int = 3) -> tuple[CaseInputs, dict]:
    inputs = CaseInputs((torch.zeros(2, 3, dtype=torch.int64), torch.randn(2, 2, past, 16),
                         torch.randn(2, 2, past, 16)), model=Step())
    dims = resolve_dims({"input_ids": {0: "batch", 1: "seq"}, "past_key": {0: "batch", 2: "past"},
                         "past_value": {0: "batch", 2: "past"}}, inputs)
    return inputs, dims


# torch 2.6.0, caught by torch.onnx and handed to refine_dynamic_shapes_from_suggested_fixes
REFINED_2_6 = """Constraints violated (past)! For more information, run with TORCH_LOGS="+dynamic".
  - Not all values of past = L['args'][0][1].size()[2] in the specified range past <= 99999 are valid because past was inferred to be a constant (3).
  - Not all values of past = L['args'][0][2].size()[2] in the specified range past <= 99999 are valid because past was inferred to be a constant (3).
Suggested fixes:
  past = 3"""
# torch 2.9.1, raised (Dim.DYNAMIC)
RAISED_2_9 = ("Constraints violated (L['past_key'].size()[2], L['past_value'].size()[2])! For more information, "
              "run with TORCH_LOGS=\"+dynamic\".\n  - You marked L['past_key'].size()[2] as dynamic but your code "
              "specialized it to be a constant (3). If you're using mark_dynamic, either remove it or use "
              "maybe_mark_dynamic.")


def _log_with_event(source: str | None) -> ExportLog:
    log = ExportLog()
    log.symbols["s3"] = "L['args'][0][1].size()[2]"
    log.events.append({"symbol": "s3", "value": 3, "input": "L['args'][0][1].size()[2]", "source": source})
    return log


def test_a_silent_re_export_is_one_fact_with_its_line_and_remedy():
    inputs, dims = _inputs()
    log = _log_with_event("decoding.py:37: return torch.full((seq, past + seq), float('-inf')).triu(past + 1)")
    log.refined.append(REFINED_2_6)
    (fact,) = log.facts(inputs, dims)
    assert (fact["dim"], fact["input"], fact["axis"], fact["value"], fact["how"]) == ("past", "input_1", 2, 3, "re-exported")
    assert fact["source"].startswith("decoding.py:37:") and fact["example"] == 3
    assert "arange comparisons" in fact["remedy"]


def test_a_raised_specialisation_is_a_fact_too():
    inputs, dims = _inputs()
    (fact,) = _log_with_event(None).facts(inputs, dims, RuntimeError(RAISED_2_9))
    assert (fact["dim"], fact["input"], fact["value"], fact["how"]) == ("past", "input_1", 3, "export failed")
    assert "torch._check" in fact["remedy"]


def test_zero_or_one_in_the_example_gets_the_example_remedy():
    inputs, dims = _inputs(past=0)
    log = ExportLog()
    log.refined.append(REFINED_2_6.replace("(3)", "(0)").replace("past = 3", "past = 0"))
    (fact,) = log.facts(inputs, dims)
    assert fact["value"] == 0 and fact["example"] == 0 and fact["source"] is None
    assert remedy(fact).startswith("torch.export specialises example sizes 0 and 1: give an example with past >= 2")


def test_torch_names_of_inputs_map_to_leaves():
    inputs, _ = _inputs()
    leaves = {leaf.key: leaf for leaf in inputs.tensor_leaves()}
    assert leaf_key("L['args'][0][1]", leaves) == (1,)          # torch 2.6: the args tuple
    assert leaf_key("L['past_value']", leaves) == (2,)          # by parameter name
    assert leaf_key("L['kwargs']['nothing']", leaves) is None


def test_watching_keeps_torch_logs_and_restores_the_logger(capsys):
    logger = logging.getLogger(SHAPES_LOGGER)
    before = (logger.level, logger.propagate, list(logger.handlers))
    log = ExportLog()
    with log.watching():
        logger.info("create_symbol s0 = 2 for L['x'].size()[0] [2, int_oo] (fakify)")
        logger.info("set_replacement s0 = 2 (range_refined_to_singleton) VR[2, 2]")
        logger.warning("Ignored guard s0 == 2, this could result in accuracy problems")
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    assert log.symbols == {"s0": "L['x'].size()[0]"} and log.ignored == ["s0 == 2"]
    (event,) = log.events
    assert event["value"] == 2 and event["source"].startswith(__file__)   # the line on the stack
    assert "Ignored guard s0 == 2" in capsys.readouterr().err              # warnings still reach the log


# torch 2.13.0 words the same re-export differently (Dim("seq") on tests/cases/dim_policy.py)
REFINED_2_13 = """Constraints violated (seq)! For more information, run with TORCH_LOGS="+dynamic".
  - Not all values of seq = L['x'].size()[1] in the specified range satisfy the generated guard 6 <= L['x'].size()[1] and L['x'].size()[1] <= 6
Suggested fixes:
  seq = 6"""


def test_the_2_13_wording_of_a_re_export_is_read_too():
    class Flat(torch.nn.Module):
        def forward(self, x):
            return x

    inputs = CaseInputs((torch.randn(2, 6, 8),), model=Flat())
    dims = resolve_dims({0: {0: "batch", 1: "seq"}}, inputs)
    log = ExportLog()
    log.refined.append(REFINED_2_13)
    (fact,) = log.facts(inputs, dims)
    assert (fact["dim"], fact["input"], fact["axis"], fact["value"], fact["how"]) == ("seq", "input_0", 1, 6, "re-exported")
    assert fact["message"].startswith("Not all values of seq = L['x'].size()[1]")
