"""timm and torchvision families as cases: one small variant each, random weights, 64x64 images.

``harness.probes.zoo.vision:timm_<family>`` / ``torchvision_<family>`` (families in
``harness.probes.zoo.TIMM_FAMILIES`` / ``TORCHVISION_FAMILIES``): ``pretrained=False`` /
``weights=None``, seeded, image batch of 2 with a dynamic batch dim (the spatial size is fixed:
many of these models bake it, e.g. ViT position embeddings).

PyPI's torchvision wheels are CUDA builds pinned to one torch release: beside a ``+cpu`` torch
(such as the local 2.13.0+cpu wheel) ``import torchvision`` fails, and timm imports torchvision.
Such a cell is a ``skip`` with that reason; run these families on torch entries installed from
PyPI's own build (README "The model zoo").
"""
from __future__ import annotations

from typing import Any, Callable

from harness.probes.zoo import TIMM_FAMILIES, TORCHVISION_FAMILIES, VISION_IMAGE


class Missing(ImportError):
    """A package the family needs cannot be imported here (a ``skip`` with this reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _import(package: str) -> Any:
    import importlib
    import importlib.util

    import torch

    hint = (" (PyPI's torchvision is a CUDA build that cannot load beside a +cpu torch: run the "
            "vision families on a torch entry installed from PyPI)") if "+cpu" in torch.__version__ else ""
    if importlib.util.find_spec(package) is None:
        raise Missing(f"package {package!r} is not installed in this environment{hint}")
    try:
        return importlib.import_module(package)
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160]}"
        raise Missing(f"{package} cannot be imported beside torch {torch.__version__}: {why}{hint}") from exc


def build(group: str, family: str):
    import torch

    table = TIMM_FAMILIES if group == "timm" else TORCHVISION_FAMILIES
    name, kwargs = table[family]
    if group == "timm":
        _import("torchvision")
        timm = _import("timm")
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, **kwargs)
    else:
        models = _import("torchvision").models
        torch.manual_seed(0)
        build = getattr(models, name)
        model = build(**kwargs) if name[0].isupper() else build(weights=None, **kwargs)
    torch.manual_seed(0)
    return model.eval(), (torch.randn(2, 3, VISION_IMAGE, VISION_IMAGE),), {0: {0: "batch"}}


def _case(group: str, family: str) -> Callable[[], Any]:
    def fn():
        return build(group, family)

    fn.__name__ = f"{group}_{family}"
    fn.__doc__ = f"{group} {family}: {dict(TIMM_FAMILIES if group == 'timm' else TORCHVISION_FAMILIES)[family][0]}"
    fn.atol = 1e-4
    return fn


def __getattr__(name: str) -> Callable[[], Any]:
    group, _, family = name.partition("_")
    table = {"timm": TIMM_FAMILIES, "torchvision": TORCHVISION_FAMILIES}.get(group)
    if table is None or family not in table:
        raise AttributeError(name)
    return _case(group, family)
