"""The post-export pipeline's built-in steps: one catalogue for both sides of the process boundary.

matrix.yaml's ``pipelines:`` names ordered lists of steps (``harness.matrix.config`` checks names
and arguments against this catalogue before anything is installed); the environment installs each
step's library as a companion package (``harness.matrix.environments``); the worker runs each as a
thin call of that library (``harness.worker.steps``); a failing step's blame names its repository.
A user's own step is ``module:function`` or ``file.py:function``, called ``function(src, dst, **args)``.

Standard library only: the worker imports this inside every environment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# How a pipeline's parity is judged, by the precision its file ends in (docs/pipelines.md). fp32:
# the case's own atol / rtol (None here). A quantized file is also judged by the cosine
# similarity of each output with eager and the agreement of its arg-max along the last axis.
JUDGES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"atol": 1e-2, "rtol": 1e-2},
    "int8": {"atol": 0.25, "rtol": 0.1, "cosine": 0.99, "top1": 0.9},
}


@dataclass(frozen=True)
class StepInfo:
    """A built-in step: the library that does it, where its bugs go, its arguments."""

    name: str
    package: str                 # the distribution installed for it
    repository: str              # where a failure of the step is reported
    call: str                    # the library call, as the docs and the repro name it
    args: dict[str, Any] = field(default_factory=dict)     # argument -> default
    choices: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    precision: str = "fp32"      # what the file computes in after the step


_ORT = ("onnxruntime", "microsoft/onnxruntime")
# ORT's transformer optimizer model types (onnxruntime.transformers.optimizer.MODEL_TYPES, 1.32).
ORT_MODEL_TYPES = ("bart", "bert", "bert_keras", "bert_tf", "clip", "conformer", "gpt2", "gpt2_tf",
                   "gpt_neox", "mmdit", "phi", "sam2", "swin", "t5", "tnlr", "unet", "vae", "vit")

STEPS: dict[str, StepInfo] = {s.name: s for s in (
    StepInfo("onnxscript-optimizer", "onnxscript", "microsoft/onnxscript", "onnxscript.optimizer.optimize"),
    StepInfo("onnxslim", "onnxslim", "inisis/OnnxSlim", "onnxslim.slim"),
    StepInfo("onnxsim", "onnxsim", "daquexian/onnx-simplifier", "onnxsim.simplify"),
    StepInfo("ort-fusion", *_ORT, "onnxruntime.transformers.optimizer.optimize_model",
             args={"model_type": "bert", "num_heads": 0, "hidden_size": 0, "opt_level": None},
             choices={"model_type": ORT_MODEL_TYPES, "opt_level": (None, 0, 1, 2, 99)}),
    StepInfo("fp16", "onnxconverter-common", "microsoft/onnxconverter-common",
             "onnxconverter_common.float16.convert_float_to_float16",
             args={"keep_io_types": True, "op_block_list": None}, precision="fp16"),
    StepInfo("fp16-ort", *_ORT, "onnxruntime.transformers.onnx_model.OnnxModel.convert_float_to_float16",
             args={"keep_io_types": True, "op_block_list": None}, precision="fp16"),
    StepInfo("quantize-dynamic", *_ORT, "onnxruntime.quantization.quantize_dynamic",
             args={"per_channel": False, "weight_type": "QInt8", "reduce_range": False},
             choices={"weight_type": ("QInt8", "QUInt8")}, precision="int8"),
    StepInfo("quantize-static", *_ORT, "onnxruntime.quantization.quantize_static (QDQ)",
             args={"per_channel": False}, precision="int8"),
    StepInfo("ort-offline", *_ORT, "onnxruntime.InferenceSession(optimized_model_filepath=...)",
             args={"level": "extended"}, choices={"level": ("basic", "extended", "all")}),
)}

# Default pins of the step libraries that are not already in every environment (a torch entry
# pins onnxslim / onnxsim by a field of its own; onnxconverter-common through ``extras``).
STEP_PINS = {"onnxslim": "0.1.98", "onnxsim": "0.8.1", "onnxconverter-common": "1.16.0"}


def is_user_step(name: str) -> bool:
    """``module:function`` or ``file.py:function``: a user's own step."""
    target, sep, function = name.rpartition(":")
    return bool(sep and target and function.isidentifier())


def precision_of(steps: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> str:
    """The precision a pipeline's file ends in: int8 after any quantization, else fp16 after a
    conversion, else fp32 (a user's step says nothing; it is judged as fp32)."""
    found = {STEPS[s["step"]].precision for s in steps if s["step"] in STEPS}
    return "int8" if "int8" in found else "fp16" if "fp16" in found else "fp32"


def repository_of(step: str) -> str | None:
    info = STEPS.get(step)
    return info.repository if info else None
