"""Cases: callables returning (model, example_inputs[, dynamic_dims]).

Referenced as a built-in probe name, ``path/to/file.py:function`` or ``package.module:function``.
Imported inside worker environments: standard library at module level, torch lazily.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.core.cell import CaseRef
from harness.probes import PROBES

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


class CaseSkipped(Exception):
    """A case that cannot run in this environment (an optional package is missing)."""


@dataclass
class CaseSpec:
    name: str
    model: Any
    inputs: tuple
    dynamic_dims: dict[int, dict[int, str]] = field(default_factory=dict)
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    was_training: bool = False
    # How dynamic_dims reach torch.onnx.export: "dict" (named axes) or "list" (dim indices).
    dynamic_axes_style: str = "dict"


def resolve_target(ref: str, base_dir: Path | None = None) -> Callable[..., Any]:
    """Turn a case reference into the callable it names."""
    parsed = CaseRef.parse(PROBES.get(ref, ref))
    target, func_name = parsed.target, parsed.function
    if parsed.is_file:
        path = Path(target)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.exists():
            raise FileNotFoundError(f"case file not found: {path}")
        mod_name = f"_harness_case_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, func_name)
    except AttributeError:
        raise AttributeError(f"{target} has no function {func_name!r}") from None


def check_requirements(fn: Callable[..., Any]) -> None:
    """Raise CaseSkipped when a package the case declares in ``requires`` is not installed."""
    for pkg in getattr(fn, "requires", ()):
        if importlib.util.find_spec(pkg) is None:
            raise CaseSkipped(f"package {pkg!r} is not installed in this environment")


def build_case(name: str, ref: str, base_dir: Path | None = None,
               atol: float | None = None, rtol: float | None = None) -> CaseSpec:
    """Call the case function and normalise what it returns."""
    import torch

    fn = resolve_target(ref, base_dir)
    check_requirements(fn)
    torch.manual_seed(0)
    try:
        result = fn()
    except ImportError as exc:
        # An ImportError with a `reason` (the zoo's unbuildable architectures) is its own reason.
        raise CaseSkipped(getattr(exc, "reason", None) or f"case needs a package that is missing: {exc}") from exc
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise TypeError(
            f"case {name!r} must return (model, example_inputs) or "
            f"(model, example_inputs, dynamic_dims), got {type(result).__name__}"
        )
    model, inputs = result[0], result[1]
    dynamic_dims = result[2] if len(result) == 3 else {}
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    dynamic_dims = {int(i): {int(d): str(n) for d, n in dims.items()}
                    for i, dims in (dynamic_dims or {}).items()}
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    return CaseSpec(
        name=name, model=model, inputs=tuple(inputs), dynamic_dims=dynamic_dims,
        atol=atol if atol is not None else getattr(fn, "atol", DEFAULT_ATOL),
        rtol=rtol if rtol is not None else getattr(fn, "rtol", DEFAULT_RTOL),
        was_training=was_training,
        dynamic_axes_style=getattr(fn, "dynamic_axes_style", "dict"),
    )
