"""A case's example inputs as a pytree: positional and keyword inputs, nested tuples, lists, dicts.

Every leaf has a key (its place in the tree: the positional index or keyword first, then one
component per level as ``torch.utils._pytree`` names it), a path users address it by
(``hidden.0``, ``1.0``, ``input_ids``) and an ONNX input name derived from the key:
positional argument ``i`` is ``input_i``, a keyword input its keyword, nested entries append
their index or key (``input_1_0``, ``past_0_key``). Leaves come in the order both exporters
make graph inputs: positional arguments, then keyword inputs in the order of the model's
``forward`` signature, each flattened depth first.

``resolve_dims`` turns a case's ``dynamic_dims`` into ``{leaf key: {dim: name}}`` from any of:
- ``{input_index: {dim: name}}``: the positional argument ``input_index`` (a tensor);
- ``{"path": {dim: name}}``: a leaf by path (``"hidden.0"``, ``"1.0"``, ``"input_ids"``);
- the structure of the inputs: a tuple mirroring the positional arguments (and then the keyword
  inputs, in signature order, as ``torch.export`` reads a tuple), or ``{"name": structure}``,
  with ``{dim: name}`` at tensors and ``None`` elsewhere.

Worker side: standard library at module level, torch lazily.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

Key = tuple  # (int | str, *components)
Dims = dict[int, str]


class InputsError(ValueError):
    """Inputs or dynamic dims a case returned that do not fit together."""


def _pytree():
    import torch.utils._pytree as pytree

    return pytree


def component(entry: Any) -> Any:
    """A pytree key entry as a plain component: index, dict key or attribute name."""
    for attr in ("idx", "key", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def signature_of(model: Any) -> inspect.Signature | None:
    fn = getattr(model, "forward", model)
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Leaf:
    key: Key
    path: str        # as users address it: parameter names first ('hidden.0')
    name: str        # the ONNX input name ('input_1_0')
    value: Any

    @property
    def is_tensor(self) -> bool:
        return _is_tensor(self.value)


class CaseInputs:
    """Positional and keyword example inputs of one case (keywords in signature order)."""

    def __init__(self, args: tuple, kwargs: Mapping[str, Any] | None = None, model: Any = None,
                 params: list[str] | None = None, names: list[str] | None = None) -> None:
        self.args = tuple(args)
        # A model may name its graph inputs (``onnx_input_names``, one per tensor leaf, as the
        # zoo's Optimum configs do); otherwise names come from the inputs' structure.
        self.names = list(names) if names else list(getattr(model, "onnx_input_names", None) or []) or None
        kwargs = dict(kwargs or {})
        sig = signature_of(model) if model is not None and params is None else None
        if sig is not None:
            order = [p for p in sig.parameters if p in kwargs]
            kwargs = {k: kwargs[k] for k in order + [k for k in kwargs if k not in order]}
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            params = [p.name for p in sig.parameters.values() if p.kind in kinds]
        self.kwargs = kwargs
        self.params = list(params or [])
        self._leaves: list[Leaf] | None = None

    # -- structure ------------------------------------------------------------------------------
    def tops(self) -> list[tuple[int | str, Any]]:
        return list(enumerate(self.args)) + list(self.kwargs.items())

    def top_label(self, top: int | str) -> str:
        if isinstance(top, int):
            return self.params[top] if top < len(self.params) else str(top)
        return top

    def leaves(self) -> list[Leaf]:
        if self._leaves is None:
            pytree = _pytree()
            out: list[Leaf] = []
            for top, value in self.tops():
                base = f"input_{top}" if isinstance(top, int) else str(top)
                for entries, leaf in pytree.tree_flatten_with_path(value)[0]:
                    comps = tuple(component(e) for e in entries)
                    out.append(Leaf(key=(top, *comps),
                                    path=".".join([self.top_label(top), *map(str, comps)]),
                                    name=valid_name("_".join([base, *map(str, comps)])), value=leaf))
            out = _dedupe(out)
            tensors = [i for i, leaf in enumerate(out) if leaf.is_tensor]
            if self.names and len(self.names) == len(tensors):
                for i, name in zip(tensors, self.names):
                    out[i] = Leaf(out[i].key, out[i].path, name, out[i].value)
            self._leaves = out
        return self._leaves

    def tensor_leaves(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves() if leaf.is_tensor]

    def input_names(self) -> list[str]:
        return [leaf.name for leaf in self.tensor_leaves()]

    def feeds(self) -> dict[str, Any]:
        """Every tensor leaf as a numpy array, keyed by its ONNX input name."""
        return {leaf.name: leaf.value.detach().cpu().numpy() for leaf in self.tensor_leaves()}

    def describe(self) -> list[dict[str, Any]]:
        """The structure, for a bundle: every leaf's path, name and kind (values of non-tensors)."""
        rows = []
        for leaf in self.leaves():
            row: dict[str, Any] = {"path": leaf.path, "key": [str(k) for k in leaf.key], "name": leaf.name}
            if leaf.is_tensor:
                row.update(kind="tensor", shape=list(leaf.value.shape), dtype=str(leaf.value.dtype))
            else:
                row.update(kind="value", value=repr(leaf.value))
            rows.append(row)
        return rows

    def map_tensors(self, fn: Callable[[Leaf], Any]) -> "CaseInputs":
        """The same structure with every tensor leaf replaced by ``fn(leaf)``."""
        pytree = _pytree()
        by_key = {leaf.key: leaf for leaf in self.leaves()}

        def rebuild(top: int | str, value: Any) -> Any:
            flat, spec = pytree.tree_flatten_with_path(value)
            new = []
            for entries, leaf in flat:
                item = by_key[(top, *(component(e) for e in entries))]
                new.append(fn(item) if item.is_tensor else leaf)
            return pytree.tree_unflatten(new, spec)

        args = tuple(rebuild(i, v) for i, v in enumerate(self.args))
        kwargs = {k: rebuild(k, v) for k, v in self.kwargs.items()}
        return CaseInputs(args, kwargs, params=self.params, names=self.names)

    def mirror(self, spec_for: Callable[[Leaf], Any]) -> list[Any]:
        """One structure per top-level input, shaped like it, with ``spec_for(leaf)`` at each
        leaf: what ``torch.export`` reads as ``dynamic_shapes``."""
        pytree = _pytree()
        by_key = {leaf.key: leaf for leaf in self.leaves()}
        out = []
        for top, value in self.tops():
            flat, spec = pytree.tree_flatten_with_path(value)
            out.append(pytree.tree_unflatten(
                [spec_for(by_key[(top, *(component(e) for e in entries))]) for entries, _ in flat], spec))
        return out

    def call(self, model: Any) -> Any:
        return model(*self.args, **self.kwargs)

    # -- addressing -----------------------------------------------------------------------------
    def node(self, key: Key) -> Any:
        """The value (a leaf or a subtree) at ``key``."""
        top, *rest = key
        value = self.args[top] if isinstance(top, int) else self.kwargs[top]
        for comp in rest:
            value = _child(value, comp)
        return value

    def resolve_path(self, path: int | str) -> Key:
        """A user's address of an input (``1``, ``"hidden.0"``, ``"input_ids"``) → its key."""
        if isinstance(path, int):
            if not 0 <= path < len(self.args):
                raise InputsError(f"input index {path} is out of range: the case has "
                                  f"{len(self.args)} positional inputs")
            return (path,)
        if not isinstance(path, str) or not path:
            raise InputsError(f"dynamic dims key {path!r}: expected an input index or a path such as 'hidden.0'")
        first, *rest = path.split(".")
        if first in self.kwargs:
            top: int | str = first
        elif first in self.params[: len(self.args)]:
            top = self.params.index(first)
        elif first.isdigit() and int(first) < len(self.args):
            top = int(first)
        else:
            raise InputsError(f"dynamic dims key {path!r}: no input named {first!r} "
                              f"(inputs: {', '.join(self.paths())})")
        key: Key = (top,)
        value = self.node(key)
        for part in rest:
            comp = _match_component(value, part)
            if comp is None:
                raise InputsError(f"dynamic dims key {path!r}: no entry {part!r} under "
                                  f"{'.'.join(path.split('.')[: len(key)])!r} (inputs: {', '.join(self.paths())})")
            key += (comp,)
            value = _child(value, comp)
        return key

    def paths(self) -> list[str]:
        return [leaf.path for leaf in self.leaves()]


def _child(value: Any, comp: Any) -> Any:
    if isinstance(value, Mapping):
        return value[comp]
    if isinstance(comp, int) and isinstance(value, (tuple, list)):
        return value[comp]
    return getattr(value, comp)


def child_components(value: Any) -> list[Any]:
    """The components of ``value``'s children as the pytree names them ([] for a leaf)."""
    pytree = _pytree()
    flat, spec = pytree.tree_flatten_with_path(value, is_leaf=lambda x: x is not value)
    if len(flat) == 1 and not flat[0][0]:
        return []
    return [component(entries[0]) for entries, _ in flat]


def _match_component(value: Any, part: str) -> Any:
    comps = child_components(value)
    for comp in comps:
        if str(comp) == part:
            return comp
    if part.isdigit() and isinstance(value, (tuple, list)) and int(part) < len(comps):
        return comps[int(part)]  # a namedtuple field by position
    return None


_INVALID = re.compile(r"[^A-Za-z0-9_]+")


def valid_name(text: str) -> str:
    name = _INVALID.sub("_", text).strip("_") or "input"
    return name if not name[0].isdigit() else f"input_{name}"


def _dedupe(leaves: list[Leaf]) -> list[Leaf]:
    seen: set[str] = set()
    out = []
    for leaf in leaves:
        name, n = leaf.name, 1
        while name in seen:
            n += 1
            name = f"{leaf.name}_{n}"
        seen.add(name)
        out.append(leaf if name == leaf.name else Leaf(leaf.key, leaf.path, name, leaf.value))
    return out


# -- dynamic dims --------------------------------------------------------------------------------
def is_dim_map(spec: Any) -> bool:
    """``{dim: name}`` (dims as ints, or digit strings from JSON), the spec of one tensor."""
    return (isinstance(spec, Mapping) and bool(spec)
            and all(isinstance(d, int) or (isinstance(d, str) and d.lstrip("-").isdigit()) for d in spec)
            and all(v is None or isinstance(v, str) for v in spec.values()))


def resolve_dims(dims: Any, inputs: CaseInputs) -> dict[Key, Dims]:
    """A case's ``dynamic_dims`` in any accepted form → ``{leaf key: {dim: name}}``."""
    out: dict[Key, Dims] = {}
    if not dims:
        return out
    if isinstance(dims, (tuple, list)):
        tops = [top for top, _ in inputs.tops()]
        if len(dims) not in (len(inputs.args), len(tops)):
            raise InputsError(f"dynamic dims given as a sequence of {len(dims)} entries; expected one "
                              f"per positional input ({len(inputs.args)}) or per input ({len(tops)})")
        for top, spec in zip(tops, dims):
            _mirror(out, (top,), inputs, spec, inputs.top_label(top))
    elif isinstance(dims, Mapping):
        for path, spec in dims.items():
            key = inputs.resolve_path(path)
            _mirror(out, key, inputs, spec, str(path))
    else:
        raise InputsError(f"dynamic dims must be a dict or a tuple, got {type(dims).__name__}")
    return out


def _mirror(out: dict[Key, Dims], key: Key, inputs: CaseInputs, spec: Any, where: str) -> None:
    if spec is None:
        return
    value = inputs.node(key)
    if _is_tensor(value):
        if not is_dim_map(spec):
            raise InputsError(f"dynamic dims at {where!r}: the input is a tensor, expected {{dim: name}} "
                              f"(got {spec!r})")
        merged = out.setdefault(key, {})
        for d, name in spec.items():
            d = int(d)
            if not -value.dim() <= d < value.dim():
                raise InputsError(f"dynamic dims at {where!r}: dim {d} is out of range for a tensor of "
                                  f"shape {list(value.shape)}")
            if name is not None:
                merged[d % value.dim()] = str(name)
        return
    comps = child_components(value)
    if not comps:
        raise InputsError(f"dynamic dims at {where!r}: the input is a {type(value).__name__}, not a tensor")
    if is_dim_map(spec):
        raise InputsError(f"dynamic dims at {where!r}: the input is a {type(value).__name__} of "
                          f"{len(comps)} entries; address its tensors by path ('{where}.0') or give "
                          "the same structure")
    if isinstance(spec, Mapping):
        pairs = [(k if k in comps else _match_component(value, str(k)), k, s) for k, s in spec.items()]
    elif isinstance(spec, (tuple, list)):
        if len(spec) != len(comps):
            raise InputsError(f"dynamic dims at {where!r}: {len(spec)} entries for an input of {len(comps)}")
        pairs = [(c, i, s) for (i, s), c in zip(enumerate(spec), comps)]
    else:
        raise InputsError(f"dynamic dims at {where!r}: expected the input's structure, got {spec!r}")
    for comp, label, sub in pairs:
        if comp is None:
            raise InputsError(f"dynamic dims at {where!r}: no entry {label!r}")
        _mirror(out, key + (comp,), inputs, sub, f"{where}.{label}")


def dims_by_name(dims: dict[Key, Dims], inputs: CaseInputs) -> dict[str, Dims]:
    """Resolved dims keyed by ONNX input name (what ``dynamic_axes`` takes)."""
    names = {leaf.key: leaf.name for leaf in inputs.leaves()}
    return {names[k]: dict(v) for k, v in dims.items()}


def dims_by_path(dims: dict[Key, Dims], inputs: CaseInputs) -> dict[str, Dims]:
    paths = {leaf.key: leaf.path for leaf in inputs.leaves()}
    return {paths[k]: dict(v) for k, v in dims.items()}


def iter_dims(dims: dict[Key, Dims]) -> Iterator[tuple[Key, int, str]]:
    for key, ds in dims.items():
        for d, name in sorted(ds.items()):
            yield key, d, name
