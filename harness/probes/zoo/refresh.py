"""Regenerate ``transformers.json``: the architectures Optimum exports to ONNX, built here.

    python -m harness.probes.zoo.refresh [--only bert,gpt2] [--output PATH]

Run it with a Python that has torch, transformers and optimum-onnx (the companion pins of
``harness.probes.real.companion_extras``). For every model type Optimum's ``TasksManager``
registers for the ``onnx`` exporter and the transformers library it records the tasks, the
default task (``feature-extraction`` where Optimum has it, else the first it lists), the ONNX
config class, its validation tolerance per task, the shrink overrides (``shrink.py``), the
dummy-input shape overrides, which of the ONNX config's dynamic axes the eager model accepts at
another size, and the parameter count; or, where the architecture cannot be built, ``skip``
with the reason. Nothing is downloaded. The matrix reads the file at plan time, so a refresh is
a reviewed change of the case list.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.probes.zoo import TRANSFORMERS_JSON

# Per-architecture changes on top of shrink(): sizes the generic rules get wrong, and dummy
# shapes (Optimum's input_shapes keywords) the tiny configs need. Each says why.
EXTRA_OVERRIDES: dict[str, dict[str, Any]] = {
    # Rotary dims must fit the tiny head; codegen splits heads into mp_num=4 groups.
    "gptj": {"rotary_dim": 8},
    "codegen": {"n_embd": 64, "n_head": 4, "rotary_dim": 8},
    # Multi-head latent attention and routed experts at tiny sizes.
    "deepseek_v3": {"num_key_value_heads": 2, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "qk_head_dim": 16, "head_dim": 8,
                    "v_head_dim": 16, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1},
    # EfficientNetConfig defaults to B7; hidden_dim must equal round_filters(1280).
    "efficientnet": {"width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 320},
    "mobilenet_v1": {"depth_multiplier": 0.25}, "mobilenet_v2": {"depth_multiplier": 0.25},
    # CvT indexes its drop-path list by stage: stage i needs more than i blocks.
    "cvt": {"depth": [1, 2, 3]},
    # The spatial embeddings concatenate 4 coordinate and 2 shape embeddings (4c + 2s = hidden).
    "layoutlmv3": {"coordinate_size": 6, "shape_size": 4},
    # LiLT's layout branch is hidden / channel_shrink_ratio wide and splits it 6 ways.
    "lilt": {"hidden_size": 48},
    "esm": {"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32},
    "markuplm": {"max_depth": 8},
    # Two stages keep the window (4) inside the feature map of a 64x64 image.
    "swin": {"window_size": 4, "depths": [1, 1], "num_heads": [1, 1]},
    "donut-swin": {"window_size": 4, "depths": [1, 1], "num_heads": [1, 1]},
    # VITS samples noise at inference: without it the output is deterministic (comparable).
    "vits": {"noise_scale": 0.0, "noise_scale_duration": 0.0},
    "dinov2": {"image_size": 56},
    # Whisper's encoder takes exactly 2 * max_source_positions frames (3000 by default).
    "whisper": {"max_source_positions": 64},
    "vitpose": {"backbone_config.image_size": [64, 48], "backbone_config.out_indices": [2]},
    # DeepSeek's multi-head latent attention has no grouped key/value heads.
    "moonshine": {"encoder_num_key_value_heads": 2, "decoder_num_key_value_heads": 2},
    "colpali": {"vlm_config.vision_config.image_size": 56, "vlm_config.vision_config.num_image_tokens": 16},
    "sam": {"vision_config.num_pos_feats": 16, "vision_config.global_attn_indexes": [1]},
    # The detection necks take the backbone's last three stages.
    "rt_detr": {"num_queries": 32, "encoder_in_channels": [32, 64, 64], "decoder_in_channels": [32, 32, 32]},
    "rt_detr_v2": {"num_queries": 32, "encoder_in_channels": [32, 64, 64], "decoder_in_channels": [32, 32, 32]},
    "d_fine": {"num_queries": 32, "encoder_in_channels": [32, 64, 64], "decoder_in_channels": [32, 32, 32],
               "backbone_config.stem_channels": [3, 16, 16],
               "backbone_config.stage_in_channels": [16, 32, 32, 64],
               "backbone_config.stage_mid_channels": [16, 16, 32, 32],
               "backbone_config.stage_out_channels": [32, 32, 64, 64],
               "backbone_config.stage_num_blocks": [1, 1, 1, 1],
               "backbone_config.stage_numb_of_layers": [2, 2, 2, 2]},
    "perceiver": {"d_latents": 32, "num_latents": 16, "num_self_attends_per_block": 2,
                  "num_self_attention_heads": 2, "num_cross_attention_heads": 2},
}
# Why an architecture cannot be built here, where the error alone does not say it plainly.
REASONS: dict[str, str] = {
    "musicgen": ("Optimum's musicgen ONNX config only describes its sub-models (text encoder, EnCodec "
                 "decoder, decoder): text-to-audio has no single-model export"),
    "speecht5": ("Optimum exports speecht5's text-to-audio as encoder, decoder and postnet+vocoder "
                 "sub-models and needs a vocoder checkpoint from the Hub (model_kwargs['vocoder'])"),
    "pix2struct": ("Optimum reads pix2struct's static input shapes from its Hub processor, which needs "
                   "a T5 tokenizer vocabulary file"),
    "trocr": ("Optimum lists feature-extraction for trocr, but transformers' AutoModel has no TrOCR "
              "entry (TrOCR is only a decoder inside vision-encoder-decoder)"),
}
# Dummy input shapes (Optimum's input_shapes keywords) the tiny configs need.
SHAPES: dict[str, dict[str, int]] = {
    "mctct": {"audio_sequence_length": 96},
    "whisper": {"nb_max_frames": 128},
    # Optimum names the features' and the mask's length alike: keep them equal.
    "speech_to_text": {"audio_sequence_length": 16},
    "d_fine": {"height": 64, "width": 64}, "rt_detr": {"height": 64, "width": 64},
    "rt_detr_v2": {"height": 64, "width": 64},
}
# Config constructor keywords: DETR-style models default to a timm backbone; transformers' own
# ResNet backbone needs no extra package and nothing pretrained.
INIT: dict[str, dict[str, Any]] = {
    m: {"use_timm_backbone": False, "use_pretrained_backbone": False, "backbone": None}
    for m in ("detr", "table-transformer")
}
# Composite configs have no defaults: built from sub-configs.
COMPOSE: dict[str, dict[str, Any]] = {
    "encoder-decoder": {"method": "from_encoder_decoder_configs", "configs": [
        {"model_type": "bert"}, {"model_type": "bert", "is_decoder": True, "add_cross_attention": True}]},
    "vision-encoder-decoder": {"method": "from_encoder_decoder_configs", "configs": [
        {"model_type": "vit"}, {"model_type": "gpt2", "is_decoder": True, "add_cross_attention": True}]},
    "musicgen": {"method": "from_sub_models_config", "configs": [
        {"model_type": "t5"}, {"model_type": "encodec"}, {"class": "MusicgenDecoderConfig"}]},
}
# Optimum's generators for these read the model folder's preprocessor.
PREPROCESSORS: dict[str, dict[str, Any]] = {
    "dinov2": {"class": "BitImageProcessor", "kwargs": {"crop_size": {"height": 56, "width": 56},
                                                        "size": {"shortest_edge": 56}}},
    "perceiver": {"class": "PerceiverTokenizer"},
    "vitpose": {"class": "VitPoseImageProcessor", "kwargs": {"size": {"height": 64, "width": 48}}},
}
MAX_PARAMETERS = 3_000_000


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("torch", "transformers", "optimum", "optimum-onnx"):
        try:
            out[dist] = metadata.version(dist).split("+")[0]
        except metadata.PackageNotFoundError:
            pass
    return out


def onnx_model_types() -> dict[str, list[str]]:
    """model type → ONNX tasks, as Optimum's TasksManager registers them for transformers."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the ONNX configs)
    from optimum.exporters.tasks import TasksManager

    table = TasksManager._LIBRARY_TO_SUPPORTED_MODEL_TYPES["transformers"]
    return {m: list(tasks["onnx"]) for m, tasks in sorted(table.items()) if "onnx" in tasks}


def config_class(model_type: str, task: str) -> Any:
    from optimum.exporters.tasks import TasksManager

    ctor = TasksManager._LIBRARY_TO_SUPPORTED_MODEL_TYPES["transformers"][model_type]["onnx"][task]
    return getattr(ctor, "func", ctor)


def default_task(tasks: list[str]) -> str:
    if "feature-extraction" in tasks:
        return "feature-extraction"
    return next((t for t in tasks if not t.endswith("-with-past")), tasks[0])


def atols(model_type: str, tasks: list[str]) -> dict[str, float]:
    out = {}
    for task in tasks:
        atol = config_class(model_type, task).ATOL_FOR_VALIDATION
        if isinstance(atol, dict):
            atol = atol.get(task.replace("-with-past", ""), max(atol.values()))
        out[task] = float(atol)
    return out


def task_skips(tasks: list[str]) -> dict[str, str]:
    return {t: ("past key values are inputs of this task; a case's inputs are plain tensors, so the "
                "zoo builds the task without past") for t in tasks if t.endswith("-with-past")}


def grow(inputs: dict[str, Any], axes: dict[str, dict[int, str]], names: set[str]) -> dict[str, Any]:
    """The inputs with every dim named in ``names`` grown, as the worker's second shape does."""
    import torch

    sizes: dict[str, int] = {}
    for key, dims in axes.items():
        for d, n in dims.items():
            if n in names and key in inputs:
                cur = inputs[key].shape[int(d)]
                sizes.setdefault(n, cur + 1 if cur > 1 else 3)
    out = {}
    gen = torch.Generator().manual_seed(1)
    for key, x in inputs.items():
        y = x
        for d, n in sorted(axes.get(key, {}).items()):
            if n in sizes and isinstance(y, torch.Tensor):
                y = y.index_select(int(d), torch.arange(sizes[n]) % y.shape[int(d)])
        if isinstance(y, torch.Tensor) and y.is_floating_point() and y is not x:
            y = y + 0.1 * float(x.std()) * torch.randn(y.shape, generator=gen, dtype=y.dtype)
        out[key] = y
    return out


def growable_axes(model: Any, inputs: dict[str, Any], axes: dict[str, dict[int, str]]) -> list[str]:
    """The dynamic axes of the ONNX config that the eager model accepts at another size."""
    import torch

    def runs(names: set[str]) -> bool:
        try:
            with torch.no_grad():
                model(**grow(inputs, axes, names))
            return True
        except Exception:  # noqa: BLE001 - an axis eager rejects is exported static
            return False

    names = sorted({n for dims in axes.values() for n in dims.values()})
    ok = [n for n in names if runs({n})]
    while ok and not runs(set(ok)):
        ok.pop()
    return ok


def survey(model_type: str, tasks: list[str]) -> dict[str, Any]:
    """One architecture's entry: built, run eagerly at two shapes, or a skip with the reason."""
    import torch
    from optimum.exporters.tasks import TasksManager

    from harness.probes.zoo import hf
    from harness.probes.zoo.shrink import shrink

    task = default_task(tasks)
    entry: dict[str, Any] = {"task": task, "tasks": tasks,
                             "onnx_config": config_class(model_type, task).__name__,
                             "atol": atols(model_type, tasks)[task], "atols": atols(model_type, tasks)}
    skips = task_skips(tasks)
    if skips:
        entry["task_skips"] = skips
    if model_type in TasksManager._UNSUPPORTED_CLI_MODEL_TYPE:
        entry["unbuildable"] = (f"Optimum registers {model_type!r} only as a part of another export "
                         "(its exporter refuses it as a model of its own)")
        return entry
    for key, table in (("init", INIT), ("compose", COMPOSE), ("preprocessor", PREPROCESSORS)):
        if model_type in table:
            entry[key] = table[model_type]
    try:
        base = hf.config_of(model_type, entry)
    except Exception as exc:  # noqa: BLE001 - any failure to build a config is what the table records
        entry["unbuildable"] = (f"transformers {metadata.version('transformers')} has no config class for "
                         f"{model_type!r} ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
        return entry
    overrides = shrink(base, getattr(config_class(model_type, task), "NORMALIZED_CONFIG_CLASS", None))
    overrides.update(EXTRA_OVERRIDES.get(model_type, {}))
    entry["config"] = overrides
    if model_type in SHAPES:
        entry["shapes"] = SHAPES[model_type]
    try:
        model = hf.make_model(model_type, task, hf.config_of(model_type, entry))
        hf.save_preprocessor(model_type, entry.get("preprocessor"), model.config)
        entry["model_class"] = type(model).__name__
        entry["parameters"] = int(sum(p.numel() for p in model.parameters()))
        onnx_config = hf.onnx_config_for(model, task)
        inputs = hf.dummy_inputs(onnx_config, entry.get("shapes", {}))
        names = hf.ordered_names(model, onnx_config, inputs)
        entry["inputs"] = {n: {"shape": list(inputs[k].shape), "dtype": str(inputs[k].dtype).removeprefix("torch."),
                               "axes": {str(d): a for d, a in onnx_config.inputs.get(n, {}).items()}}
                           for k, n in names}
        entry["outputs"] = list(onnx_config.outputs)
        with torch.no_grad():
            model(**inputs)
        axes = {k: onnx_config.inputs.get(n, {}) for k, n in names}
        entry["dynamic"] = growable_axes(model, inputs, axes)
    except Exception as exc:  # noqa: BLE001 - any failure to build the model is what the table records
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        entry["unbuildable"] = f"{REASONS[model_type]} ({error})" if model_type in REASONS else f"cannot build it here: {error}"
        print(traceback.format_exc(limit=-3)[-1500:], file=sys.stderr)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.probes.zoo.refresh", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated model types (default: all)")
    parser.add_argument("--output", type=Path, default=TRANSFORMERS_JSON)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    types = onnx_model_types()
    wanted = args.only.split(",") if args.only else list(types)
    previous = {}
    if args.only and args.output.exists():
        previous = json.loads(args.output.read_text())["architectures"]
    entries = dict(previous)
    for model_type in wanted:
        t0 = time.perf_counter()
        entry = survey(model_type, types[model_type])
        entries[model_type] = entry
        state = f"unbuildable: {entry['unbuildable']}" if entry.get("unbuildable") else f"{entry['parameters']:,} parameters"
        print(f"{model_type:32s} {time.perf_counter() - t0:6.2f}s {state}", flush=True)
    data = {"generated_by": "python -m harness.probes.zoo.refresh", "versions": _versions(),
            "architectures": dict(sorted(entries.items()))}
    args.output.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    built = sum(1 for e in entries.values() if not e.get("unbuildable"))
    print(f"{built} of {len(entries)} architectures built; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
