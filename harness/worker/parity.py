"""Parity of runtime outputs against torch eager, and inputs at a second shape.

Standard library and numpy only at module level; torch lazily.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class ParityError(AssertionError):
    """Outputs differ beyond tolerance, in count, shape or dtype, or hold NaN/Inf where eager does not.

    ``stats``: the numbers of the comparison that failed, as ``compare_outputs`` returns them
    when it passes (``max_abs``, ``max_rel``, and per output the worst element, the count beyond
    tolerance or what was wrong), so that a failing cell keeps them on its record."""

    def __init__(self, message: str, stats: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.stats = stats if stats is not None else {}


def compare_outputs(expected: list[np.ndarray], actual: list[np.ndarray],
                    atol: float, rtol: float, label: str,
                    floors: list[float | None] | None = None) -> dict[str, Any]:
    """Compare per output; return the numbers; raise ParityError on any mismatch, naming the
    first output that differs, with the numbers of every output (``ParityError.stats``).

    NaN and Inf pass only where eager has them at exactly the same places (Inf with the same
    sign); the returned ``notes`` then say so ("example shape: output 0: 3 NaN values at the
    same places as eager"), for the caller to put on the record.

    ``floors`` (per output, ``harness.worker.noise``; None: not judged against the noise): the
    model's own float32 noise, judged besides atol / rtol by the rule of ``harness.worker.noise``
    (noise beyond the tolerance passes with a note; a divergence far above it fails).
    """
    if len(expected) != len(actual):
        message = f"{label}: runtime returned {len(actual)} outputs, eager {len(expected)}"
        raise ParityError(message, {"max_abs": None, "max_rel": None, "outputs": [], "error": message,
                                    "notes": []})
    per_output = []
    notes: list[str] = []
    problems: list[str] = []
    worst: dict[str, Any] = {"max_abs": None, "max_rel": None}
    for i, (exp, act) in enumerate(zip(expected, actual)):
        act = np.asarray(act)
        if exp.shape != act.shape:
            problem = f"{label}: output {i} shape {list(act.shape)} != eager {list(exp.shape)}"
            stats = {"max_abs": None, "max_rel": None, "worst_index": None, "dtype": str(act.dtype),
                     "shape": list(act.shape), "eager_shape": list(exp.shape)}
        else:
            floor = floors[i] if floors is not None and i < len(floors) else None
            stats, problem = _compare_one(exp, act, atol, rtol, f"{label}: output {i}", floor)
            if note := _nonfinite_note(stats, act.size):
                notes.append(f"{label}: output {i}: {note}")
            if stats.get("within_noise"):
                notes.append(f"{label}: output {i}: {stats['beyond']}/{act.size} elements beyond atol={atol:g} "
                             f"rtol={rtol:g} (max_abs {stats['max_abs']:.3g}), within the model's own float32 "
                             f"noise (floor {stats['noise_floor']:.3g}, ratio {stats['noise_ratio']:.3g})")
        if problem:
            stats["error"] = problem
            problems.append(problem)
        per_output.append(stats)
        for k in ("max_abs", "max_rel"):
            if stats.get(k) is not None:
                worst[k] = max(worst[k] or 0.0, stats[k])
    result = {**worst, "outputs": per_output, "notes": notes}
    if problems:
        raise ParityError(problems[0], result)
    return {**{k: v or 0.0 for k, v in worst.items()}, "outputs": per_output, "notes": notes}


def _nonfinite_note(stats: dict[str, Any], size: int) -> str | None:
    parts = [f"{stats[k]} {name}" for k, name in (("nan", "NaN"), ("inf", "Inf")) if stats.get(k)]
    if not parts:
        return None
    total = stats.get("nan", 0) + stats.get("inf", 0)
    every = ": no finite value was compared" if total == size else ""
    return f"{' and '.join(parts)} values at the same places as eager{every}"


def _first(mask: np.ndarray) -> tuple:
    return np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape)


def _compare_one(exp: np.ndarray, act: np.ndarray, atol: float, rtol: float,
                 label: str, floor: float | None = None) -> tuple[dict, str | None]:
    """The numbers of one output, and what is wrong with it (None: within tolerance)."""
    if exp.dtype != act.dtype:
        return ({"max_abs": None, "max_rel": None, "worst_index": None, "dtype": str(act.dtype),
                 "eager_dtype": str(exp.dtype)}, f"{label}: dtype {act.dtype} != eager {exp.dtype}")
    if exp.dtype == np.bool_:
        bad = np.flatnonzero(exp != act)
        stats = {"max_abs": float(bool(bad.size)), "max_rel": 0.0, "worst_index": None, "dtype": str(act.dtype)}
        if bad.size:
            idx = [int(i) for i in np.unravel_index(bad[0], exp.shape)]
            stats.update(worst_index=idx, beyond=int(bad.size))
            return stats, f"{label}: {bad.size} boolean elements differ, first at {idx}"
        return stats, None
    e = exp.astype(np.float64)
    a = act.astype(np.float64)
    e_nan, a_nan = np.isnan(e), np.isnan(a)
    e_inf, a_inf = np.isinf(e), np.isinf(a)
    # Non-finite values agree only at exactly the same places (and Inf with the same sign).
    for mask, what in ((a_nan & ~e_nan, "NaN where eager is not"),
                       (e_nan & ~a_nan, "not NaN where eager is NaN"),
                       (a_inf & ~e_inf & ~e_nan, "Inf where eager is finite"),
                       (e_inf & ~a_inf & ~a_nan, "finite where eager is Inf"),
                       (e_inf & a_inf & (np.sign(e) != np.sign(a)), "Inf of the other sign than eager")):
        if mask.any():
            at = _first(mask)
            problem = (f"{label}: {int(mask.sum())}/{mask.size} values {what}, first at "
                       f"{[int(i) for i in at]} (eager {e[at]:.6g}, runtime {a[at]:.6g})")
            break
    else:
        problem = None
    finite = np.isfinite(e) & np.isfinite(a)
    with np.errstate(invalid="ignore"):   # inf - inf where both are Inf: masked out below
        diff = np.where(finite, np.abs(a - e), 0.0)
    rel = np.where(finite, diff / np.maximum(np.abs(e), 1e-12), 0.0)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    worst = np.unravel_index(int(diff.argmax()), diff.shape) if diff.size else ()
    excess = diff - (atol + rtol * np.abs(np.where(finite, e, 0.0)))
    stats = {"max_abs": max_abs, "max_rel": max_rel,
             "worst_index": [int(i) for i in worst], "dtype": str(act.dtype)}
    n_nan, n_inf = int(e_nan.sum()), int(e_inf.sum())
    if n_nan or n_inf:
        # Counted so a report can tell "matches eager" from "nothing finite was compared".
        stats.update({"nan": n_nan, "inf": n_inf})
    if diff.size:
        at = tuple(stats["worst_index"])
        stats.update(eager=float(e[at]), runtime=float(a[at]))   # the worst element's values
    noise = _noise_verdict(stats, floor, e, finite) if diff.size else None
    if problem is None and diff.size and (excess > 0).any():
        n_bad = int((excess > 0).sum())
        stats["beyond"] = n_bad
        if noise == "noise":
            stats["within_noise"] = True
        else:
            problem = (f"{label}: {n_bad}/{diff.size} elements beyond atol={atol:g} rtol={rtol:g}; "
                       f"max_abs={max_abs:.3g} at {stats['worst_index']} (eager {e[at]:.6g}, "
                       f"runtime {a[at]:.6g}); max_rel={max_rel:.3g}")
            if "noise_ratio" in stats:
                problem += f"; {stats['noise_ratio']:.3g}× the model's own float32 noise"
    elif problem is None and noise == "divergence":
        problem = (f"{label}: max_abs={max_abs:.3g} at {stats['worst_index']} (eager {e[at]:.6g}, "
                   f"runtime {a[at]:.6g}) is {stats['noise_ratio']:.3g}× the model's own float32 noise "
                   f"(floor {floor:.3g}), {stats['worst_rel']:.2g} of the value: a divergence, though "
                   f"within atol={atol:g} rtol={rtol:g}")
    return stats, problem


def _noise_verdict(stats: dict[str, Any], floor: float | None, e: np.ndarray,
                   finite: np.ndarray) -> str | None:
    """Where the output stands against the model's own noise (rule: ``harness.worker.noise``):
    'noise' (a difference the floor excuses), 'divergence' (far above it), None (neither, or no
    floor). Records the floor and the ratio in ``stats``."""
    from harness.worker.noise import (
        DIVERGENCE_RATIO,
        DIVERGENCE_REL,
        NOISE_MAX_SHARE,
        NOISE_RATIO,
    )

    if floor is None or not floor > 0:
        return None
    ratio = stats["max_abs"] / floor
    stats.update(noise_floor=float(floor), noise_ratio=float(ratio))
    scale = float(np.abs(e[finite]).max()) if finite.any() else 0.0
    worst_rel = abs(stats["runtime"] - stats["eager"]) / max(abs(stats["eager"]), 1e-300)
    if ratio <= NOISE_RATIO and floor <= NOISE_MAX_SHARE * scale:
        return "noise"
    if ratio > DIVERGENCE_RATIO and worst_rel > DIVERGENCE_REL:
        stats["worst_rel"] = float(worst_rel)
        return "divergence"
    return None


def second_size(size: int) -> int:
    """The size a dynamic dim of example size ``size`` has at the generated second shape: the
    one place of the size rule (docs/report.md, "The second shape").

    - 0 → 1: an empty dim (a KV cache at the first decoding step) gets one entry;
    - 1 → 3: a batch-1 example leaves the sizes 0 and 1 that torch.export specialises;
    - n → n + 1 otherwise.
    """
    if size < 0:
        raise ValueError(f"a dim cannot have size {size}")
    if size == 0:
        return 1
    return 3 if size == 1 else size + 1


def second_shape_inputs(inputs: Any, dynamic_dims: dict, seed: int = 1) -> Any:
    """Inputs that differ from the example in every dynamic dim (same name → same new size,
    ``second_size``).

    ``inputs`` is a ``CaseInputs`` with dims keyed by leaf key, or (older callers) a tuple of
    positional inputs with dims keyed by index; the result is of the same kind (None without
    dynamic dims). Values respect what integer inputs encode: along a grown dim, entries are
    repeated in place (index ``k * old // new``), never wrapped around, so sorted lengths stay
    sorted, padding masks keep their padding at the same end, token ids stay valid ids, and
    every input grown along one named dim stays aligned with the others; an integer input that
    counts 0, 1, 2, ... along the dim (positions) keeps counting, and 1-D lengths whose longest
    entry is another dynamic dim's size (padded to the longest) follow that dim. Float inputs
    get fresh seeded noise of their own scale on top. An empty dim has no entries to repeat:
    its new entries are standard normal floats, zeros for integers and False for booleans.
    A model that still refuses them in eager
    gets a note, not a failure (``GroupContext``); a case can give its own ``second_inputs``.
    """
    import torch

    from harness.worker.inputs import CaseInputs, iter_dims

    if not dynamic_dims:
        return None
    legacy = not isinstance(inputs, CaseInputs)
    case_inputs = CaseInputs(tuple(inputs), params=[]) if legacy else inputs
    dims = {(k,) if isinstance(k, int) else tuple(k): v for k, v in dynamic_dims.items()}
    old: dict[str, int] = {}
    for key, d, name in iter_dims(dims):
        old.setdefault(name, case_inputs.node(key).shape[d])
    sizes = {name: second_size(cur) for name, cur in old.items()}
    gen = torch.Generator().manual_seed(seed)

    def grow(leaf) -> Any:
        x = leaf.value
        if not dims.get(leaf.key):
            return x
        y = x
        for d, name in sorted(dims[leaf.key].items()):
            y = _grow_dim(y, d, sizes[name], gen)
        # Lengths: a 1-D count whose longest entry is the padded size of another dynamic dim
        # keeps reaching it (a batch padded to its longest sequence stays so).
        other = [n for n in old if n not in dims[leaf.key].values() and old[n] >= 2]
        if _is_lengths(y) and other:
            longest = next((n for n in other if int(y.max()) == old[n]), None)
            if longest is not None:
                y = torch.where(y == old[longest], torch.full_like(y, sizes[longest]), y)
        if y.is_floating_point() and x.numel():
            scale = float(x.std()) if x.numel() > 1 else 1.0
            y = y + 0.1 * scale * torch.randn(y.shape, generator=gen, dtype=y.dtype)
        return y.contiguous()

    grown = case_inputs.map_tensors(grow)
    return grown.args if legacy else grown


def _grow_dim(x: Any, dim: int, size: int, gen: Any = None) -> Any:
    import torch

    old = x.shape[dim]
    if old == 0:
        # Nothing to repeat along an empty dim: fresh entries (floats of unit scale).
        shape = [size if i == dim else n for i, n in enumerate(x.shape)]
        if x.is_floating_point():
            return torch.randn(shape, generator=gen, dtype=x.dtype)
        return torch.zeros(shape, dtype=x.dtype)
    if _counts_along(x, dim):
        steps = torch.arange(size, dtype=x.dtype).reshape([-1 if i == dim else 1 for i in range(x.dim())])
        return x.narrow(dim, 0, 1) + steps
    index = torch.arange(size) * old // size
    return x.index_select(dim, index)


def _counts_along(x: Any, dim: int) -> bool:
    """An integer tensor that is 0, 1, 2, ... along ``dim`` (position ids)."""
    import torch

    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool or x.shape[dim] < 2:
        return False
    return bool((x.narrow(dim, 0, 1) == 0).all() and (torch.diff(x, dim=dim) == 1).all())


def _is_lengths(x: Any) -> bool:
    """A 1-D integer tensor of counts (not a 0/1 mask)."""
    import torch

    return (x.dim() == 1 and not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
            and x.numel() > 0 and bool((x >= 0).all()) and int(x.max()) > 1)


def quality(expected: list[np.ndarray], actual: list[np.ndarray]) -> dict[str, float | None]:
    """How close a quantized (or half-precision) file's outputs are to eager, as a whole: the
    lowest cosine similarity of an output with eager's (flattened, float64), and the lowest share
    of positions whose arg-max along the last axis agrees (outputs with a last axis of 2 or more;
    None when there is none). Non-finite values count as disagreement."""
    cosines, top1 = [], []
    for exp, act in zip(expected, actual):
        e = np.asarray(exp, dtype=np.float64).ravel()
        a = np.asarray(act, dtype=np.float64).ravel()
        if e.shape != a.shape or not e.size:
            continue
        if not (np.isfinite(e).all() and np.isfinite(a).all()):
            cosines.append(-1.0)
            continue
        norm = float(np.linalg.norm(e) * np.linalg.norm(a))
        cosines.append(1.0 if norm == 0 and not e.any() and not a.any() else float(e @ a / norm) if norm else 0.0)
        exp_nd, act_nd = np.asarray(exp), np.asarray(act)
        if exp_nd.ndim and exp_nd.shape[-1] >= 2 and exp_nd.shape == act_nd.shape:
            top1.append(float(np.mean(exp_nd.argmax(-1) == act_nd.argmax(-1))))
    return {"cosine": min(cosines) if cosines else None, "top1": min(top1) if top1 else None}


def judge_quality(stats: dict[str, float | None], judge: dict[str, Any], label: str) -> str | None:
    """The first threshold of ``judge`` (``cosine``, ``top1``) the shape's ``quality`` misses."""
    for name in ("cosine", "top1"):
        want, got = judge.get(name), stats.get(name)
        if want is not None and got is not None and got < want:
            return (f"{label}: {name} {got:.4f} with eager is below the {judge.get('class', '')} "
                    f"threshold {want:g}")
    return None


def first_difference(references: list[list[Any]], outputs: list[list[Any]], atol: float, rtol: float,
                     floors: list[Any] | None = None) -> str | None:
    """None when every shape agrees with eager, else what differs first; judged as the cell was
    (``floors``: the model's own noise per shape, ``harness.worker.noise``)."""
    for i, (ref, out) in enumerate(zip(references, outputs)):
        try:
            compare_outputs(ref, out, atol, rtol, "example shape" if i == 0 else "second shape",
                            floors[i] if floors is not None and i < len(floors) else None)
        except ParityError as exc:
            return str(exc)
    return None
