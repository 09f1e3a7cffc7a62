"""Cases: callables returning a model, its example inputs and which dims are dynamic.

A case returns one of
- ``(model, args[, dynamic_dims[, second_inputs]])``: ``args`` a tuple of positional inputs
  (a single tensor is one input), nested tuples, lists and dicts allowed;
- ``(model, inputs_mapping[, dynamic_dims[, second_inputs]])``: keyword inputs
  (``{"input_ids": ..., "attention_mask": ...}``);
- ``(model, args, kwargs[, dynamic_dims[, second_inputs]])``: both.
``dynamic_dims`` is resolved by ``harness.worker.inputs.resolve_dims`` (index, path or structure).
``second_inputs`` (or the function's ``second_inputs`` attribute, a value or a callable) are
inputs of the same structure at another shape, used instead of generated ones.

Referenced as a built-in probe name, ``path/to/file.py:function`` or ``package.module:function``.
Imported inside worker environments: standard library at module level, torch lazily.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.core.cell import CaseRef
from harness.probes import PROBES
from harness.worker.inputs import CaseInputs, InputsError, Key, is_dim_map, resolve_dims

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


class CaseSkipped(Exception):
    """A case that cannot run in this environment (an optional package is missing)."""


@dataclass
class CaseSpec:
    name: str
    model: Any
    example: CaseInputs
    dynamic_dims: dict[Key, dict[int, str]] = field(default_factory=dict)   # by leaf key
    second: CaseInputs | None = None      # the case's own inputs at another shape
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    was_training: bool = False
    # How dynamic_dims reach torch.onnx.export: "dict" (named axes) or "list" (dim indices).
    dynamic_axes_style: str = "dict"
    # Files the case function declares it reads (``fn.data_files``), as existing paths.
    data_files: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple:
        """The positional example inputs (keyword inputs are in ``example.kwargs``)."""
        return self.example.args


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
        # A case file imports its repository's own modules (`from models import Net`) as a
        # script beside them would: its folder is importable.
        if str(path.resolve().parent) not in sys.path:
            sys.path.append(str(path.resolve().parent))
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
        try:
            model, example, dims, second = parse_result(name, result)
        except TypeError as exc:
            # A function a `cases:` glob took whatever its body: say which one returned no case.
            raise TypeError(f"{exc} (the function {ref})") from None
        if second is None:
            second = getattr(fn, "second_inputs", None)
            second = second() if callable(second) else second
    except ImportError as exc:
        # An ImportError with a `reason` (the zoo's unbuildable architectures) is its own reason.
        raise CaseSkipped(getattr(exc, "reason", None) or f"case needs a package that is missing: {exc}") from exc
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    example = CaseInputs(example.args, example.kwargs, model=model)
    try:
        dynamic_dims = resolve_dims(dims, example)
        second_inputs = as_inputs(second, example, model) if second is not None else None
    except InputsError as exc:
        raise InputsError(f"case {name!r}: {exc}") from None
    return CaseSpec(
        name=name, model=model, example=example, dynamic_dims=dynamic_dims, second=second_inputs,
        atol=atol if atol is not None else getattr(fn, "atol", DEFAULT_ATOL),
        rtol=rtol if rtol is not None else getattr(fn, "rtol", DEFAULT_RTOL),
        was_training=was_training,
        dynamic_axes_style=getattr(fn, "dynamic_axes_style", "dict"),
        data_files=declared_files(fn),
    )


def declared_files(fn: Callable[..., Any]) -> tuple[str, ...]:
    """``fn.data_files`` (paths or globs, relative to the file defining the case) as paths."""
    import inspect

    from harness.worker.loaded import expand_declared

    declared = getattr(fn, "data_files", None) or ()
    if isinstance(declared, (str, Path)):
        declared = (declared,)
    try:
        base = Path(inspect.getfile(fn)).resolve().parent
    except (TypeError, OSError):
        base = Path.cwd()
    return tuple(expand_declared([str(p) for p in declared], base))


_SHAPES = ("(model, args[, dynamic_dims[, second_inputs]]), (model, {keyword: input}[, ...]) or "
           "(model, args, kwargs[, dynamic_dims[, second_inputs]])")


def parse_result(name: str, result: Any) -> tuple[Any, CaseInputs, Any, Any]:
    """A case's return value → (model, example inputs, dynamic dims as given, second inputs)."""
    if not isinstance(result, tuple) or not 2 <= len(result) <= 5:
        raise TypeError(f"case {name!r} must return {_SHAPES}, got "
                        f"{type(result).__name__}{f' of {len(result)}' if isinstance(result, tuple) else ''}")
    model, first, *rest = result
    _check_model(name, model)
    if isinstance(first, Mapping):
        example = CaseInputs((), first)
    else:
        example = CaseInputs(_as_args(first), {})
        if rest and isinstance(rest[0], Mapping) and (
                not _is_dims(rest[0]) or (not rest[0] and len(rest) >= 2)):
            example = CaseInputs(example.args, rest.pop(0))
    dims = rest.pop(0) if rest else None
    second = rest.pop(0) if rest else None
    if rest:
        raise TypeError(f"case {name!r} must return {_SHAPES}; got {len(result)} elements")
    return model, example, dims, second


def _check_model(name: str, model: Any) -> None:
    """The first element a case returns is the model: a ``torch.nn.Module`` (or a callable)."""
    import torch

    if isinstance(model, torch.nn.Module):
        return
    if isinstance(model, type):
        raise TypeError(f"case {name!r}: the first element it returns must be a torch.nn.Module "
                        f"(or a callable model); got the class {model.__name__}, not an instance of it")
    if not callable(model):
        raise TypeError(f"case {name!r}: the first element it returns must be a torch.nn.Module "
                        f"(or a callable model); got {type(model).__name__} {_short(model)}")


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a case's object may fail even at repr
        return "(no repr)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _as_args(inputs: Any) -> tuple:
    import torch

    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (tuple, list)):
        return (inputs,)
    return tuple(inputs)


def _is_dims(spec: Any) -> bool:
    """Dynamic dims in any form (as opposed to keyword inputs): only dim maps and None inside."""
    if spec is None or is_dim_map(spec):
        return True
    if isinstance(spec, Mapping):
        return all(_is_dims(v) for v in spec.values())
    if isinstance(spec, (tuple, list)):
        return all(_is_dims(v) for v in spec)
    return False


def as_inputs(value: Any, like: CaseInputs, model: Any) -> CaseInputs:
    """Second inputs given as the example was (args, a keyword mapping, or (args, kwargs)), checked
    to have the example's structure."""
    if like.args and like.kwargs:
        if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], Mapping)):
            raise InputsError("second_inputs must be (args, kwargs) like the example inputs")
        out = CaseInputs(_as_args(value[0]), value[1], model=model)
    elif like.kwargs:
        if not isinstance(value, Mapping):
            raise InputsError("second_inputs must be a mapping of keyword inputs like the example inputs")
        out = CaseInputs((), value, model=model)
    else:
        out = CaseInputs(_as_args(value), {}, model=model)
    want = [(leaf.key, leaf.is_tensor) for leaf in like.leaves()]
    got = [(leaf.key, leaf.is_tensor) for leaf in out.leaves()]
    if want != got:
        raise InputsError(f"second_inputs have another structure than the example inputs: "
                          f"{[leaf.path for leaf in out.leaves()]} vs {like.paths()}")
    return out
