"""Shrink a transformers config to a tiny model of the same architecture.

Which attribute holds the depth, width, heads and vocabulary differs per architecture (``n_layer``,
``num_hidden_layers``, ``encoder_layers`` ...): Optimum's ``NormalizedConfig`` of the ONNX config
names them, so those names come first; the attributes no normalized config names (feed-forward
sizes, per-stage lists of vision backbones, sub-configs) follow one table. The result is a flat
dict of overrides (``"text_config.hidden_size": 32``) that ``apply`` sets on a fresh config: the
refresh script stores it in ``transformers.json`` and the worker applies the same dict, so every
torch release builds the same model.

No torch import: this only reads and writes config attributes.
"""
from __future__ import annotations

from typing import Any

LAYERS = 2
HIDDEN = 32
HEADS = 2
KV_HEADS = 1
FFN = 64
VOCAB = 512
IMAGE = 64
MAX_POSITIONS = 512

# Canonical NormalizedConfig keys → the size they are shrunk to.
NORMALIZED = {
    "num_layers": LAYERS, "encoder_num_layers": LAYERS, "decoder_num_layers": LAYERS,
    "hidden_size": HIDDEN, "num_attention_heads": HEADS, "encoder_num_attention_heads": HEADS,
    "decoder_num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
}
# Attributes no normalized config names, per (sub-)config, by kind.
SCALARS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                     "decoder_layers", "num_encoder_layers", "num_decoder_layers", "depth",
                     "num_hidden_groups_layers"), LAYERS),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "projection_dim",
                     "text_embed_dim", "vision_embed_dim", "d_embed", "emb_size", "embedding_size",
                     "word_embed_proj_dim", "encoder_hidden_size", "decoder_hidden_size"), HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_encoder_attention_heads",
                     "num_decoder_attention_heads", "encoder_num_attention_heads",
                     "decoder_num_attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "multi_query_group_num",
                     "encoder_num_key_value_heads", "decoder_num_key_value_heads"), KV_HEADS),
    **dict.fromkeys(("encoder_num_hidden_layers", "decoder_num_hidden_layers"), LAYERS),
    **dict.fromkeys(("attention_head_dim", "kv_lora_rank", "q_lora_rank", "v_head_dim"), 16),
    **dict.fromkeys(("conv_channels", "output_channels", "fpn_feature_size", "mask_feature_size",
                     "codevector_dim", "proj_codevector_dim", "classifier_proj_size",
                     "output_hidden_size", "xvector_output_dim", "iou_head_hidden_dim", "mlp_dim",
                     "projection_size", "encoder_hidden_dim", "duration_predictor_filter_channels",
                     "flow_size", "upsample_initial_channel"), HIDDEN),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "posterior_encoder_num_wavenet_layers",
                     "prior_encoder_num_wavenet_layers"), 2),
    "num_conv_pos_embeddings": 16,
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
                     "n_inner", "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "encoder_intermediate_size", "decoder_intermediate_size", "d_kv_ff"), FFN),
    "vocab_size": VOCAB,
}


# Special token ids: kept inside the shrunk vocabulary (embedding padding_idx must be < vocab).
TOKEN_IDS = ["pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id",
             "mask_token_id", "decoder_start_token_id", "unk_token_id", "forced_eos_token_id",
             "forced_bos_token_id", "image_token_id", "image_token_index", "boi_token_index",
             "eoi_token_index", "decoder_end_token_id"]


def _resolve(config: Any, name: str) -> str | None:
    """The attribute path a config stores ``name`` under (its attribute_map applied)."""
    parts = name.split(".")
    node = config
    for p in parts[:-1]:
        node = getattr(node, p, None)
        if node is None:
            return None
    leaf = getattr(node, "attribute_map", {}).get(parts[-1], parts[-1])
    if getattr(node, leaf, None) is None:
        return None
    return ".".join(parts[:-1] + [leaf])


def normalized_paths(config: Any, normalized_cls: Any) -> dict[str, str]:
    """Canonical key → attribute path, as Optimum's normalized config class names them."""
    out: dict[str, str] = {}
    if normalized_cls is None:
        return out
    try:
        norm = normalized_cls(config)
    except Exception:  # noqa: BLE001 - a normalized config that cannot wrap this config names nothing
        return out
    for key in NORMALIZED:
        try:
            name = object.__getattribute__(norm, key.upper())
        except AttributeError:
            continue
        if isinstance(name, str):
            sub = getattr(norm, "TEXT_CONFIG", None) if key in ("num_layers", "hidden_size",
                                                                 "num_attention_heads", "vocab_size") else None
            path = _resolve(config, f"{sub}.{name}" if sub and "." not in name else name)
            if path:
                out[key] = path
    return out


def sub_configs(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path prefix, config) for the config and every nested config object."""
    out = [(prefix, config)]
    for name, value in sorted(vars(config).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type") and not name.startswith("_"):
            out += sub_configs(value, f"{prefix}{name}.")
    return out


def _shrink_list(name: str, value: list) -> list | None:
    """Per-stage lists of vision backbones: one block per stage, narrow stages, few heads."""
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    n = len(value)
    if name in ("depths", "num_layers", "depth", "layers", "num_blocks", "block_repeats", "encoder_layers"):
        return [1] * n
    if name in ("hidden_sizes", "embed_dims", "embed_dim", "dims", "widths", "hidden_dims",
                "neck_hidden_sizes", "decoder_hidden_sizes"):
        return [16 * 2 ** min(i, 2) for i in range(n)]
    if name in ("num_heads", "num_attention_heads", "heads", "num_heads_per_stage"):
        return [1] * n
    if name in ("conv_dim", "tdnn_dim"):
        return [HIDDEN] * n
    return None


def shrink(config: Any, normalized_cls: Any = None) -> dict[str, Any]:
    """Overrides that make ``config`` tiny: Optimum's normalized names first, then the table."""
    overrides: dict[str, Any] = {}
    for key, path in normalized_paths(config, normalized_cls).items():
        overrides[path] = NORMALIZED[key]
    for prefix, node in sub_configs(config):
        attribute_map = getattr(node, "attribute_map", {})
        for name in sorted(vars(node)):
            value = getattr(node, name, None)
            path = prefix + attribute_map.get(name, name)
            if path in overrides or isinstance(value, bool):
                continue
            if isinstance(value, int) and name in SCALARS and value > SCALARS[name]:
                overrides[path] = SCALARS[name]
            elif isinstance(value, list) and (small := _shrink_list(name, value)) is not None \
                    and small != value:
                overrides[path] = small
            elif name in ("max_position_embeddings", "n_positions", "max_positions") \
                    and isinstance(value, int) and value > MAX_POSITIONS:
                overrides[path] = MAX_POSITIONS
            elif name == "image_size" and isinstance(value, int) and value > IMAGE:
                overrides[path] = IMAGE
        _consistent(node, prefix, overrides)
    return overrides


def _get(node: Any, prefix: str, name: str, overrides: dict[str, Any]) -> Any:
    return overrides.get(prefix + name, getattr(node, name, None))


def _consistent(node: Any, prefix: str, overrides: dict[str, Any]) -> None:
    """Keep derived sizes consistent: head_dim, heads dividing hidden, token ids inside the vocabulary."""
    hidden = next((_get(node, prefix, n, overrides) for n in ("hidden_size", "d_model", "n_embd", "dim")
                   if isinstance(_get(node, prefix, n, overrides), int)), None)
    heads = next((_get(node, prefix, n, overrides) for n in ("num_attention_heads", "n_head", "num_heads",
                                                              "n_heads", "encoder_attention_heads")
                  if isinstance(_get(node, prefix, n, overrides), int)), None)
    if isinstance(vars(node).get("head_dim"), int) and hidden and heads:
        overrides[prefix + "head_dim"] = hidden // heads
    if "num_key_value_heads" in vars(node) and vars(node)["num_key_value_heads"] is None:
        overrides[prefix + "num_key_value_heads"] = KV_HEADS
    if isinstance(getattr(node, "d_kv", None), int) and hidden and heads:
        overrides[prefix + "d_kv"] = hidden // heads
    vocab = _get(node, prefix, "vocab_size", overrides)
    if isinstance(vocab, int):
        for name in TOKEN_IDS:
            value = getattr(node, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
                overrides[prefix + name] = vocab - 1 - TOKEN_IDS.index(name)
            elif isinstance(value, list) and any(isinstance(v, int) and v >= vocab for v in value):
                overrides[prefix + name] = [v if v < vocab else vocab - 1 for v in value]



def apply(config: Any, overrides: dict[str, Any]) -> Any:
    """Set each ``"a.b.c": value`` override on ``config`` (sub-configs by attribute path)."""
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = config
        for p in parents:
            node = getattr(node, p)
        setattr(node, leaf, value)
    return config
