"""The model's own numerical noise: the floor a runtime's difference from eager is judged against,
besides the case's atol / rtol (``harness.worker.parity.compare_outputs``).

Torch eager's float32 outputs are themselves off from exact arithmetic by the rounding of every
operation they went through; a runtime that computes the same thing in another order is off by
about as much. Per shape and per output, the floor is how far eager's float32 outputs are from
the same model run in float64 on the same inputs (``float64``), or, where the model cannot run in
float64 (its own casts to float32 kept at float64), from a second float32 run with another operation order (``op-order``: other intra-op
thread count, oneDNN off). It is never below one float32 rounding step (``eps``) of the output's
largest value. ONNX Runtime and OpenVINO differ from eager by 0 to 1.6 floors on the probes and
the decoding cases (``tests/run/noise_measure.py``; docs/report.md has the figures).

The rule, in one place (docs/report.md, "Tolerances"):

- an output within atol / rtol passes, unless its worst difference is more than
  ``DIVERGENCE_RATIO`` times the floor and more than ``DIVERGENCE_REL`` of the value there (a
  divergence far above the noise, whatever the tolerance): it fails;
- an output beyond atol / rtol passes when its worst difference is at most ``NOISE_RATIO`` times
  the floor (float32 accumulation noise, not a parity failure), as long as the floor is a noise
  floor: at most ``NOISE_MAX_SHARE`` of the output's scale (a larger gap between float32 and
  float64 means eager itself is unstable there, a flipped comparison or a cancellation, and no
  difference is excused by it);
- both only at precision fp32 and for floating outputs; the record's ``parity.shapes[i].outputs[j]``
  keeps ``noise_floor`` and ``noise_ratio``, ``parity.noise`` how the floor was measured.

Worker side: numpy at module level, torch lazily.
"""
from __future__ import annotations

import copy
import traceback
from typing import Any

import numpy as np

NOISE_RATIO = 10.0
NOISE_MAX_SHARE = 1e-3
DIVERGENCE_RATIO = 1000.0
DIVERGENCE_REL = 1e-2
FLOAT64, OP_ORDER = "float64", "op-order"
# Above this many parameters the float64 copy (three times the model's memory with the model
# itself) is not made: the op-order floor is measured instead.
FLOAT64_MAX_PARAMS = 50_000_000


def eps_of(dtype: Any) -> float:
    """One rounding step of a floating dtype (float32's 2^-23 for anything numpy cannot name)."""
    try:
        return float(np.finfo(dtype).eps)
    except (TypeError, ValueError):
        return float(np.finfo(np.float32).eps)


def output_floor(eager: np.ndarray, other: np.ndarray) -> float | None:
    """The floor of one output: the largest finite difference between eager and the other run,
    at least one rounding step of eager's largest finite value; None for a non-floating output
    or one the other run did not give at the same shape."""
    if eager.dtype.kind not in "fc" or other.shape != eager.shape:
        return None
    e, o = eager.astype(np.float64), np.asarray(other).astype(np.float64)
    finite = np.isfinite(e) & np.isfinite(o)
    if not finite.any():
        return None
    measured = float(np.abs(e - o)[finite].max())
    return max(measured, eps_of(eager.dtype) * float(np.abs(e[finite]).max()))


def _as_float64(value: Any) -> Any:
    return value.double() if value.is_floating_point() else value


def _upcast_mode() -> Any:
    """A torch function mode in which the model's own casts to a narrower float (``.float()``,
    ``.to(torch.float32)``, ``dtype=torch.float32`` in a factory) give float64: models that compute
    a part in float32 on purpose (Hugging Face's RMSNorm and rotary embeddings) would otherwise do
    it in float32 in the float64 copy too, and the floor would miss that part's error."""
    import torch
    from torch.overrides import TorchFunctionMode

    narrow = (torch.float32, torch.float16, torch.bfloat16)
    widen = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}

    class Float64(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = {k: (torch.float64 if v in narrow else v) for k, v in (kwargs or {}).items()}
            if func in widen:
                return args[0].double()
            if func in (torch.Tensor.to, torch.Tensor.type):
                args = tuple(torch.float64 if a in narrow else a for a in args)
            return func(*args, **kwargs)

    return Float64()


def _float64_outputs(model: Any, inputs: Any) -> list[np.ndarray]:
    """The model, copied and converted to float64, run on the inputs converted to float64, its own
    casts to float32 kept at float64 (``_upcast_mode``)."""
    import torch

    from harness.worker.outputs import output_leaves

    twin = copy.deepcopy(model).double()
    wide = inputs.map_tensors(lambda leaf: _as_float64(leaf.value))
    with torch.no_grad(), _upcast_mode():
        return [a for _, a in output_leaves(wide.call(twin))]


def _reordered_outputs(model: Any, inputs: Any) -> list[np.ndarray]:
    """A second float32 run with another operation order: another intra-op thread count and
    oneDNN off (other kernels, other blocking, other summation order)."""
    import torch

    from harness.worker.outputs import output_leaves

    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else 1)
    try:
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            return [a for _, a in output_leaves(inputs.call(model))]
    finally:
        torch.set_num_threads(threads)


def measure(model: Any, shapes: list[Any], references: list[list[np.ndarray]]) -> dict[str, Any]:
    """The floors of every shape's outputs: ``{"method", "floors": [[floor or None per output]
    per shape]}``, plus ``"float64_error"`` when the float64 run failed (the op-order floor is
    used then). Raises only on the matrix's own failure (the caller makes it an ``error``)."""
    out: dict[str, Any] = {"method": FLOAT64}
    runs = []
    size = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    try:
        if size > FLOAT64_MAX_PARAMS:
            raise MemoryError(f"{size} parameters: no float64 copy above {FLOAT64_MAX_PARAMS}")
        runs = [_float64_outputs(model, s) for s in shapes]
    except Exception as exc:  # noqa: BLE001 - a model that cannot run in float64: the other method
        traceback.print_exc()
        out.update(method=OP_ORDER, float64_error=f"{type(exc).__name__}: {str(exc).strip()[:200]}")
        runs = [_reordered_outputs(model, s) for s in shapes]
    floors = []
    for refs, others in zip(references, runs):
        if len(others) != len(refs):
            floors.append([None] * len(refs))   # another output structure: no floor to take
            continue
        floors.append([output_floor(np.asarray(r), np.asarray(o)) for r, o in zip(refs, others)])
    out["floors"] = floors
    return out


def summary(measured: dict[str, Any] | None, shapes: list[dict[str, Any]], judged: bool) -> dict[str, Any] | None:
    """What a record's ``parity.noise`` says: how the floor was measured (or why not), whether it
    was judged (fp32 only), and the worst ratio of a runtime difference to its floor with that
    floor (per output, the numbers are in ``parity.shapes[i].outputs[j]``)."""
    if not measured:
        return None
    out = {k: v for k, v in measured.items() if k != "floors"}
    out["judged"] = judged
    worst = max((o for s in shapes for o in s.get("outputs", []) if o.get("noise_ratio") is not None),
                key=lambda o: o["noise_ratio"], default=None)
    if worst is not None:
        out.update(ratio=worst["noise_ratio"], floor=worst["noise_floor"])
    return out
