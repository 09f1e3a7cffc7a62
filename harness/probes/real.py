"""Real architectures as optional cases: random weights from small configs, nothing downloaded.

transformers and torchvision are per-environment extras (`extras:` of a torch entry); a case
whose package is missing is a `skip` with that reason (cases.check_requirements).
`companion_extras` gives pins that install beside a given torch (with ``zoo=True`` also
optimum-onnx and timm, for the model zoo, ``harness/probes/zoo``).
"""
from __future__ import annotations

import torch
from packaging.version import Version

# transformers 4.57 is the last 4.x line (torch >= 2.2); 5.x needs torch >= 2.5 and moved APIs
# that small-config construction relies on, so the 4.x line is the default everywhere it runs.
_TRANSFORMERS = [("2.2", "4.57.6"), ("0", "4.38.2")]
# optimum-onnx 0.1.0 (optimum 2.1) needs transformers >= 4.36, < 4.58 and any torch >= 1.11: the
# zoo's Optimum side for every torch that takes transformers 4.57.6. Older torch: optimum 1.x,
# which still carried the ONNX exporter (unverified here).
_OPTIMUM = [("2.2", "optimum-onnx==0.1.0"), ("0", "optimum[exporters]==1.17.1")]
# timm 1.0.x imports torchvision and supports every torch 2.x release.
TIMM = "1.0.31"
# transformers' image processors need PIL (Optimum reads dinov2's and vitpose's crop size there).
PILLOW = "11.3.0"


def torchvision_for(torch_version: str) -> str:
    """torchvision release built against a torch release: 2.<m>.<p> -> 0.<m + 15>.<p>.

    PyPI torchvision wheels pin torch (==2.13.0 for 0.28.0) and are CUDA builds: beside a
    +cpu torch their C extension fails to load (libtorch_cuda.so), so `import torchvision` fails.
    """
    v = Version(torch_version)
    if v.major != 2:
        raise ValueError(f"no torchvision mapping for torch {torch_version}")
    return f"0.{v.minor + 15}.{v.micro}"


def transformers_for(torch_version: str) -> str:
    v = Version(torch_version)
    return next(pin for floor, pin in _TRANSFORMERS if v >= Version(floor))


def optimum_for(torch_version: str) -> str:
    v = Version(torch_version)
    return next(req for floor, req in _OPTIMUM if v >= Version(floor))


def companion_extras(torch_version: str, zoo: bool = False, vision: bool = True) -> list[str]:
    """Requirement strings for the `extras:` of a torch entry that runs the `real` group, or with
    ``zoo`` the zoo groups (adds optimum-onnx and timm). ``vision=False`` leaves out torchvision
    and timm: for a local ``+cpu`` torch, beside which PyPI's CUDA torchvision cannot import
    (the vision families are then a `skip` with that reason).

    Verified (``tests/probes/test_zoo.py``, README "The model zoo"): 2.13.0 (zoo, vision=False) and
    2.6.0 (zoo, on a sample of architectures and families); other releases follow the rules above.
    """
    extras = [f"transformers=={transformers_for(torch_version)}"]
    if zoo:
        extras += [optimum_for(torch_version), f"pillow=={PILLOW}"]
    if vision:
        extras.insert(0, f"torchvision=={torchvision_for(torch_version)}")
        if zoo:
            extras.append(f"timm=={TIMM}")
    return extras


class _TextModel(torch.nn.Module):
    """(input_ids, attention_mask) -> last_hidden_state: plain tensors in and out, as exported.

    Keywords, not positions: GPT2Model's second positional parameter is past_key_values.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _TensorModel(torch.nn.Module):
    """One tensor in -> last_hidden_state (ModelOutput is not a plain exportable output)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).last_hidden_state


def _tokens(vocab: int, batch: int = 2, seq: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, seq), dtype=torch.int64)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq - 3:] = 0  # the second sequence is padded; position 0 always attended
    return ids, mask


def bert():
    """BertModel, 2 layers, hidden 64: token ids + attention mask, dynamic batch and sequence."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, attn_implementation="eager")
    model = _TextModel(BertModel(cfg, add_pooling_layer=False)).eval()
    ids, mask = _tokens(cfg.vocab_size)
    dims = {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 1: "seq"}}
    return model, (ids, mask), dims


def gpt2():
    """GPT2Model, 2 layers, n_embd 64, no KV cache: causal attention with a padding mask."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                     use_cache=False, attn_implementation="eager")
    model = _TextModel(GPT2Model(cfg)).eval()
    ids, mask = _tokens(cfg.vocab_size)
    return model, (ids, mask), {0: {0: "batch", 1: "seq"}, 1: {0: "batch", 1: "seq"}}


def vit():
    """ViTModel, 2 layers, 32x32 images in 8x8 patches, dynamic batch."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                    attn_implementation="eager")
    model = _TensorModel(ViTModel(cfg, add_pooling_layer=False)).eval()
    return model, (torch.randn(2, 3, 32, 32),), {0: {0: "batch"}}


def whisper_encoder():
    """Whisper encoder at whisper-tiny width (d_model 384, 4 layers, 6 heads) on 80 mel bins.

    The input length is fixed at 2 * max_source_positions (the encoder checks it), so only the
    batch is dynamic.
    """
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                        encoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=100,
                        attn_implementation="eager")
    model = _TensorModel(WhisperEncoder(cfg)).eval()
    return model, (torch.randn(2, 80, 200),), {0: {0: "batch"}}


whisper_encoder.atol = 1e-3


def resnet18():
    """torchvision resnet18, weights=None, 64x64 images, dynamic batch."""
    from torchvision.models import resnet18 as build

    torch.manual_seed(0)
    return build(weights=None).eval(), (torch.randn(2, 3, 64, 64),), {0: {0: "batch"}}


def mobilenet_v3_small():
    """torchvision mobilenet_v3_small, weights=None (hardswish, squeeze-excite), dynamic batch."""
    from torchvision.models import mobilenet_v3_small as build

    torch.manual_seed(0)
    return build(weights=None).eval(), (torch.randn(2, 3, 64, 64),), {0: {0: "batch"}}


for _fn in (bert, gpt2, vit, whisper_encoder):
    _fn.requires = ["transformers"]
for _fn in (resnet18, mobilenet_v3_small):
    _fn.requires = ["torchvision"]
for _fn in (bert, gpt2, vit, resnet18, mobilenet_v3_small):
    _fn.atol = 1e-4
