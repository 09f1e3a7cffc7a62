"""Built-in cases: trap probes (shared TRAPS.md) and optional real architectures.

PROBES maps a name usable in matrix.yaml to 'module:function'; GROUPS maps a group name to the
case names it expands to. Real architectures need packages that are extras per environment
(transformers, torchvision), so they form their own group, not part of `probes`. The model zoo's
groups (`transformers`, `timm`, `torchvision`, with selections such as `transformers:bert`) are
expanded by `harness.probes.zoo.expand` from its checked-in case list.
"""
from __future__ import annotations

TRAP_PROBES: dict[str, str] = {
    "mha": "harness.probes.attention:mha",
    "mha_kv": "harness.probes.attention:mha_kv",
    "transformer_encoder": "harness.probes.attention:transformer_encoder",
    "repeat_interleave": "harness.probes.shapes:repeat_interleave",
    "int_concat": "harness.probes.shapes:int_concat",
    "reduce_axes": "harness.probes.shapes:reduce_axes",
    "shape_fold": "harness.probes.shapes:shape_fold",
    "sdpa": "harness.probes.attention:sdpa",
    "data_dependent_scale": "harness.probes.shapes:data_dependent_scale",
    "control_flow": "harness.probes.shapes:control_flow",
    "dynamic_axes_names": "harness.probes.shapes:dynamic_axes_names",
    "lstm": "harness.probes.recurrent:lstm",
    "gru": "harness.probes.recurrent:gru",
    "conv_bn": "harness.probes.vision:conv_bn",
}

REAL_MODELS: dict[str, str] = {
    "bert": "harness.probes.real:bert",
    "gpt2": "harness.probes.real:gpt2",
    "vit": "harness.probes.real:vit",
    "whisper_encoder": "harness.probes.real:whisper_encoder",
    "resnet18": "harness.probes.real:resnet18",
    "mobilenet_v3_small": "harness.probes.real:mobilenet_v3_small",
}

PROBES: dict[str, str] = {**TRAP_PROBES, **REAL_MODELS}

# Names usable in matrix.yaml as a whole group of cases.
GROUPS: dict[str, list[str]] = {
    "probes": list(TRAP_PROBES),
    "real": list(REAL_MODELS),
}
