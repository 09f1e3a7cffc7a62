"""Parity of runtime outputs against torch eager, and inputs at a second shape.

Standard library and numpy only at module level; torch lazily.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class ParityError(AssertionError):
    """Outputs differ beyond tolerance, in count, shape or dtype, or hold NaN/Inf where eager does not."""


def flatten_outputs(obj: Any) -> list[np.ndarray]:
    """Torch outputs (tensor, tuple, list, dict, ModelOutput) → flat list of numpy arrays, in the
    order both exporters flatten them; None and non-tensor leaves are dropped."""
    import torch

    out: list[np.ndarray] = []

    def visit(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            out.append(x.detach().cpu().resolve_conj().resolve_neg().numpy())
        elif isinstance(x, dict) or hasattr(x, "to_tuple"):
            for v in (x.values() if isinstance(x, dict) else x.to_tuple()):
                visit(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)

    visit(obj)
    return out


def compare_outputs(expected: list[np.ndarray], actual: list[np.ndarray],
                    atol: float, rtol: float, label: str) -> dict[str, Any]:
    """Compare per output; return the numbers; raise ParityError on any mismatch.

    NaN and Inf pass only where eager has them at exactly the same places (Inf with the same
    sign); the returned ``notes`` then say so ("example shape: output 0: 3 NaN values at the
    same places as eager"), for the caller to put on the record.
    """
    if len(expected) != len(actual):
        raise ParityError(f"{label}: runtime returned {len(actual)} outputs, eager {len(expected)}")
    per_output = []
    notes: list[str] = []
    worst = {"max_abs": 0.0, "max_rel": 0.0}
    for i, (exp, act) in enumerate(zip(expected, actual)):
        act = np.asarray(act)
        if exp.shape != act.shape:
            raise ParityError(f"{label}: output {i} shape {list(act.shape)} != eager {list(exp.shape)}")
        stats = _compare_one(exp, act, atol, rtol, f"{label}: output {i}")
        if note := _nonfinite_note(stats, act.size):
            notes.append(f"{label}: output {i}: {note}")
        per_output.append(stats)
        worst["max_abs"] = max(worst["max_abs"], stats["max_abs"])
        worst["max_rel"] = max(worst["max_rel"], stats["max_rel"])
    return {**worst, "outputs": per_output, "notes": notes}


def _nonfinite_note(stats: dict[str, Any], size: int) -> str | None:
    parts = [f"{stats[k]} {name}" for k, name in (("nan", "NaN"), ("inf", "Inf")) if stats.get(k)]
    if not parts:
        return None
    total = stats.get("nan", 0) + stats.get("inf", 0)
    every = ": no finite value was compared" if total == size else ""
    return f"{' and '.join(parts)} values at the same places as eager{every}"


def _first(mask: np.ndarray) -> tuple:
    return np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape)


def _compare_one(exp: np.ndarray, act: np.ndarray, atol: float, rtol: float, label: str) -> dict:
    if exp.dtype != act.dtype:
        raise ParityError(f"{label}: dtype {act.dtype} != eager {exp.dtype}")
    if exp.dtype == np.bool_:
        bad = np.flatnonzero(exp != act)
        if bad.size:
            idx = np.unravel_index(bad[0], exp.shape)
            raise ParityError(f"{label}: {bad.size} boolean elements differ, first at {list(map(int, idx))}")
        return {"max_abs": 0.0, "max_rel": 0.0, "worst_index": None, "dtype": str(act.dtype)}
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
            raise ParityError(f"{label}: {int(mask.sum())}/{mask.size} values {what}, first at "
                              f"{[int(i) for i in at]} (eager {e[at]:.6g}, runtime {a[at]:.6g})")
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
    if diff.size and (excess > 0).any():
        n_bad = int((excess > 0).sum())
        at = tuple(stats["worst_index"])
        raise ParityError(
            f"{label}: {n_bad}/{diff.size} elements beyond atol={atol:g} rtol={rtol:g}; "
            f"max_abs={max_abs:.3g} at {stats['worst_index']} (eager {e[at]:.6g}, "
            f"runtime {a[at]:.6g}); max_rel={max_rel:.3g}"
        )
    return stats


def second_shape_inputs(inputs: tuple, dynamic_dims: dict[int, dict[int, str]],
                        seed: int = 1) -> tuple | None:
    """Inputs that differ from the example in every dynamic dim (same name → same new size).

    Values are the example wrapped along each grown dim, so token ids stay valid ids and masks
    keep their structure; float inputs get fresh seeded noise of the same scale on top.
    """
    import torch

    if not dynamic_dims:
        return None
    sizes: dict[str, int] = {}
    for i, dims in dynamic_dims.items():
        for d, name in dims.items():
            cur = inputs[i].shape[d]
            sizes.setdefault(name, cur + 1 if cur > 1 else 3)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, x in enumerate(inputs):
        if i not in dynamic_dims or not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        y = x
        for d, name in sorted(dynamic_dims[i].items()):
            index = torch.arange(sizes[name]) % y.shape[d]
            y = y.index_select(d, index)
        if y.is_floating_point():
            scale = float(x.std()) if x.numel() > 1 else 1.0
            y = y + 0.1 * scale * torch.randn(y.shape, generator=gen, dtype=y.dtype)
        out.append(y.contiguous())
    return tuple(out)
