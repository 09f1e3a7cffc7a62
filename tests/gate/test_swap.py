"""Which change flipped a bisected verdict (harness.gate.swap): the newer torch tried again with
the older release's companion pins, all together, then one at a time."""
from __future__ import annotations

from harness.gate.swap import env_pins, which_change
from harness.matrix.config import Matrix

MATRIX = Matrix.model_validate({"torch": ["2.6.0", "2.13.0"], "exporters": ["dynamo"], "opsets": [18],
                                "cases": ["conv_bn"]})
VERDICTS = {"2.6.0": "pass", "2.13.0": "fail (parity)"}


def _verdicts(rule):
    """verdict_with from a rule over the variant's pins; the variants asked for are kept."""
    asked = []

    def verdict_with(matrix: Matrix, label: str):
        spec = matrix.torch[0]
        asked.append((label, {k: getattr(spec, k) for k in ("numpy", "onnx", "onnxscript", "protobuf")}))
        assert [t.version for t in matrix.torch] == ["2.13.0"]
        return rule(spec)
    return verdict_with, asked


def test_the_pin_that_brings_the_old_verdict_back_is_named():
    verdict_with, asked = _verdicts(lambda s: "pass" if s.onnxscript == "0.2.7" else "fail (parity)")
    line = which_change(MATRIX, "2.6.0", "2.13.0", VERDICTS, verdict_with)
    assert line == ("the change that flipped it: onnxscript 0.2.7 → 0.7.2 (torch 2.13.0 with onnxscript "
                    "0.2.7 is pass again)")
    assert asked[0][1] == {"numpy": "2.2.6", "onnx": "1.17.0", "onnxscript": "0.2.7", "protobuf": "5.29.5"}


def test_a_verdict_the_old_pins_do_not_change_is_torchs():
    verdict_with, asked = _verdicts(lambda s: "fail (parity)")
    line = which_change(MATRIX, "2.6.0", "2.13.0", VERDICTS, verdict_with)
    assert line.startswith("the change that flipped it: torch 2.6.0 → 2.13.0 (torch 2.13.0 with 2.6.0's pins")
    assert line.endswith("is still fail (parity))") and len(asked) == 1


def test_an_untestable_swap_says_it_cannot_tell():
    verdict_with, _ = _verdicts(lambda s: None)
    assert which_change(MATRIX, "2.6.0", "2.13.0", VERDICTS, verdict_with).startswith("cannot tell which change")


def test_releases_with_the_same_pins_need_no_swap():
    same = Matrix.model_validate({"torch": [{"version": "2.12.0", "onnxscript": "0.7.2", "numpy": "2.4.6",
                                              "onnx": "1.23.2"}, "2.13.0"],
                                  "exporters": ["dynamo"], "opsets": [18], "cases": ["conv_bn"]})
    assert env_pins(same, "2.12.0").get("onnxscript") == env_pins(same, "2.13.0")["onnxscript"]
    assert which_change(same, "2.12.0", "2.13.0", {"2.12.0": "pass", "2.13.0": "pass"},
                        lambda m, label: 1 / 0) is None
