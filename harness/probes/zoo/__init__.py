"""The model zoo: every architecture Optimum exports to ONNX, and timm / torchvision families.

matrix.yaml names them as groups, expanded here at plan time from checked-in data (no torch,
transformers or Optimum import on the runner side):

- ``transformers``: one case per model type of ``transformers.json`` (written by
  ``python -m harness.probes.zoo.refresh`` in an environment that has optimum-onnx), each for
  its default task (``feature-extraction`` where Optimum has it); ``transformers:bert,gpt2``
  selects model types; ``transformers:task=fill-mask`` every model type Optimum exports for that
  task, built for it (case ``hf-bert[fill-mask]``);
- ``timm`` / ``torchvision``: one small variant per family (``timm:resnet,vit`` selects
  families), random weights.

Case names: ``hf-<model_type>``, ``timm-<family>``, ``torchvision-<family>``.
"""
from __future__ import annotations

import difflib
import functools
import json
import re
from pathlib import Path
from typing import Any

ZOO_DIR = Path(__file__).resolve().parent
TRANSFORMERS_JSON = ZOO_DIR / "transformers.json"
HF_MODULE = "harness.probes.zoo.hf"
VISION_MODULE = "harness.probes.zoo.vision"

# family → (constructor name, keyword arguments); one small variant each, pretrained=False.
TIMM_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "resnet": ("resnet18", {}),
    "efficientnet": ("efficientnet_b0", {}),
    "mobilenetv3": ("mobilenetv3_small_050", {}),
    "convnext": ("convnext_atto", {}),
    "regnet": ("regnetx_002", {}),
    "vit": ("vit_tiny_patch16_224", {"img_size": 64}),
    "deit": ("deit_tiny_patch16_224", {"img_size": 64}),
    "swin": ("swin_tiny_patch4_window7_224", {"img_size": 64, "window_size": 4}),
    "levit": ("levit_128s", {"img_size": 64}),
    "mixer": ("mixer_s16_224", {"img_size": 64}),
    "ghostnet": ("ghostnet_050", {}),
    "mobilevit": ("mobilevit_xxs", {}),
    "poolformer": ("poolformer_s12", {}),
    "densenet": ("densenet121", {}),
}
TORCHVISION_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "resnet": ("resnet18", {}),
    "mobilenetv3": ("mobilenet_v3_small", {}),
    "efficientnet": ("efficientnet_b0", {}),
    "convnext": ("convnext_tiny", {}),
    "regnet": ("regnet_y_400mf", {}),
    # The smallest ViT / Swin / MaxViT builders are 28-86M parameters: the family's class at a
    # small width instead (a class name: no weights argument).
    "vit": ("VisionTransformer", {"image_size": 64, "patch_size": 16, "num_layers": 2, "num_heads": 2,
                                  "hidden_dim": 64, "mlp_dim": 128}),
    "swin": ("SwinTransformer", {"patch_size": [4, 4], "embed_dim": 32, "depths": [1, 1],
                                 "num_heads": [1, 2], "window_size": [4, 4]}),
    "squeezenet": ("squeezenet1_1", {}),
    "shufflenet": ("shufflenet_v2_x0_5", {}),
    "mnasnet": ("mnasnet0_5", {}),
    "densenet": ("densenet121", {}),
    "googlenet": ("googlenet", {"aux_logits": False, "init_weights": True}),
    "maxvit": ("MaxVit", {"input_size": [64, 64], "stem_channels": 16, "partition_size": 2,
                          "block_channels": [16, 32], "block_layers": [1, 1], "head_dim": 8,
                          "stochastic_depth_prob": 0.0}),
}
VISION_IMAGE = 64  # input height and width of every vision family
ZOO_GROUPS = ("transformers", "timm", "torchvision")


@functools.lru_cache(maxsize=1)
def transformers_data() -> dict[str, Any]:
    return json.loads(TRANSFORMERS_JSON.read_text(encoding="utf-8"))


def transformers_entries() -> dict[str, dict[str, Any]]:
    return transformers_data()["architectures"]


def _ident(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", text)


def case_function(model_type: str, task: str | None = None) -> str:
    """The function name of an architecture's case in ``hf``: 'xlm_roberta', 'bert__fill_mask'."""
    return _ident(model_type) + (f"__{_ident(task)}" if task else "")


@functools.lru_cache(maxsize=1)
def _functions() -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for model_type, entry in transformers_entries().items():
        out[case_function(model_type)] = (model_type, None)
        for task in entry.get("tasks", []):
            out[case_function(model_type, task)] = (model_type, task)
    return out


def parse_case_function(name: str) -> tuple[str, str | None] | None:
    """'bert__fill_mask' → ('bert', 'fill-mask'); None for a name that is no architecture."""
    return _functions().get(name)


def case_name(model_type: str, task: str | None = None) -> str:
    return f"hf-{model_type}" + (f"[{task}]" if task else "")


def _unknown(kind: str, value: str, known: list[str], group: str) -> ValueError:
    close = difflib.get_close_matches(value, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; expected one of {', '.join(known[:12])}, …"
    return ValueError(f"{group!r}: unknown {kind} {value!r}{hint}")


def expand(token: str) -> list[dict[str, Any]] | None:
    """Case entries of a zoo group token, or None when ``token`` is not a zoo group.

    Raises ValueError naming the token and what was expected for an unknown model type, task or
    family.
    """
    group, _, selector = token.partition(":")
    if group not in ZOO_GROUPS:
        return None
    if group == "transformers":
        return _expand_transformers(token, selector)
    families = TIMM_FAMILIES if group == "timm" else TORCHVISION_FAMILIES
    wanted = [s.strip() for s in selector.split(",") if s.strip()] or list(families)
    for family in wanted:
        if family not in families:
            raise _unknown(f"{group} family", family, sorted(families), token)
    return [{"target": f"{VISION_MODULE}:{group}_{family}", "name": f"{group}-{family}"}
            for family in wanted]


def _expand_transformers(token: str, selector: str) -> list[dict[str, Any]]:
    entries = transformers_entries()
    if selector.startswith("task="):
        task = selector.removeprefix("task=").strip()
        tasks = sorted({t for e in entries.values() for t in e.get("tasks", [])})
        if task not in tasks:
            raise _unknown("task", task, tasks, token)
        chosen = [(m, None if e["task"] == task else task)
                  for m, e in entries.items() if task in e.get("tasks", [])]
    else:
        wanted = [s.strip() for s in selector.split(",") if s.strip()] or list(entries)
        for model_type in wanted:
            if model_type not in entries:
                raise _unknown("model type", model_type, sorted(entries), token)
        chosen = [(m, None) for m in wanted]
    return [{"target": f"{HF_MODULE}:{case_function(m, t)}", "name": case_name(m, t)} for m, t in chosen]


def is_zoo_case(name: str) -> bool:
    """Whether a case name is one of the zoo's (the architectures view shows those)."""
    return name.startswith(("hf-", "timm-", "torchvision-"))
