"""What a failure at the second shape says about each dynamic dim, inside the worker.

When a file works at the example shape and not at the second one (the runtime rejects it, or
its outputs differ from eager), each named dynamic dim is grown alone (``dim_outcomes``):
``rejected`` (the runtime raises), ``differs`` (it runs, and differs from eager at those inputs),
``agrees``, or ``eager-rejects`` / ``not-probed``. That names the culprit in the error
(``second_shape_error``) and is the check a specialisation is confirmed by (``explain``): a dim
the exported program pinned to one value while the file keeps a symbol is noted only when
growing it alone fails, and an example size of 0 or 1 on a culprit dim is named as the likely
cause (torch.export specialises those sizes), with the fix.

Worker side: standard library at module level; numpy and torch lazily.
"""
from __future__ import annotations

from typing import Any

FAILING = ("rejected", "differs")


def _grown_alone(ctx: Any, dim_name: str) -> Any:
    from harness.worker.parity import second_shape_inputs

    only = {key: {d: n for d, n in ds.items() if n == dim_name} for key, ds in ctx.dims.items()}
    return second_shape_inputs(ctx.spec.example, {key: ds for key, ds in only.items() if ds})


def dim_outcomes(ctx: Any, adapter: Any, graph_inputs: list[str], judge: bool) -> dict[str, str]:
    """Per named dynamic dim, what the file does when only that dim grows (``judge``: compare
    with eager too, else only whether the runtime accepts it). Eager runs first: inputs it
    refuses (dims that only grow together) say nothing about the file."""
    import numpy as np
    import torch

    from harness.runtimes.base import match_feeds
    from harness.worker.inputs import iter_dims
    from harness.worker.outputs import output_leaves
    from harness.worker.parity import ParityError, compare_outputs

    out: dict[str, str] = {}
    for dim_name in sorted({name for _, _, name in iter_dims(ctx.dims)}):
        try:
            grown = _grown_alone(ctx, dim_name)
            feeds = match_feeds(grown.feeds(), graph_inputs)
        except Exception:  # noqa: BLE001 - the probe is a diagnosis; the verdict stands without it
            out[dim_name] = "not-probed"
            continue
        try:
            with torch.no_grad():
                expected = [a for _, a in output_leaves(grown.call(ctx.spec.model))]
        except Exception:  # noqa: BLE001 - eager's own verdict on those inputs
            out[dim_name] = "eager-rejects"
            continue
        try:
            outputs = [np.asarray(o) for o in adapter.infer(feeds)]
        except Exception:  # noqa: BLE001 - probing which dim the graph rejects
            out[dim_name] = "rejected"
            continue
        if not judge:
            out[dim_name] = "runs"
            continue
        try:
            compare_outputs(expected, outputs, ctx.spec.atol, ctx.spec.rtol, f"{dim_name} grown alone")
            out[dim_name] = "agrees"
        except ParityError:
            out[dim_name] = "differs"
    return out


def culprit_text(ctx: Any, outcomes: dict[str, str], which: tuple[str, ...] = FAILING) -> list[str]:
    """"'seq' (input_0 dim 1)" for each dim whose outcome is in ``which``."""
    from harness.worker.inputs import iter_dims

    names = {leaf.key: leaf.name for leaf in ctx.spec.example.leaves()}
    out = []
    for dim_name, outcome in sorted(outcomes.items()):
        if outcome in which:
            where = [f"{names[key]} dim {d}" for key, d, n in iter_dims(ctx.dims) if n == dim_name]
            out.append(f"'{dim_name}' ({', '.join(where)})")
    return out


def explain(ctx: Any, rec: Any, outcomes: dict[str, str]) -> None:
    """Notes and ``graph.specialised`` entries the per-dim outcomes confirm, on this cell's record:
    a dim the exported program pinned while the file keeps a symbol, and an example size of 0 or
    1 on a failing dim (dynamo: torch.export specialises those sizes)."""
    confirmed = []
    for pin in getattr(ctx, "pinned", []) or []:
        outcome = outcomes.get(pin["dim"])
        if outcome in FAILING:
            what = "rejects" if outcome == "rejected" else "differs from eager at"
            note = (f"{pin['dim']} was specialised to {pin['value']} by the exporter ({pin['input']} dim "
                    f"{pin['axis']}): the file keeps the symbol {pin.get('symbol')!r} but {what} any other "
                    f"{pin['dim']} (grown alone at the second shape)")
            confirmed.append({**pin, "confirmed": outcome, "note": note})
            rec.notes.append(note)
    if confirmed:
        graph = dict(rec.graph)
        graph["specialised"] = [*graph.get("specialised", []), *confirmed]
        rec.graph = graph
    if ctx.group.exporter != "dynamo":
        return
    fixed = {f["dim"] for f in (rec.graph.get("specialised") or [])}
    zero_one = []
    for dim_name, outcome in sorted(outcomes.items()):
        size = example_size(ctx, dim_name)
        if outcome in FAILING and size in (0, 1) and dim_name not in fixed:
            zero_one.append({"dim": dim_name, "example": size, "outcome": outcome})
            rec.notes.append(zero_one_note(dim_name, size, "is the likely cause: the file fails when "
                                           f"{dim_name} alone grows"))
    if zero_one:
        rec.graph = {**rec.graph, "zero_one": zero_one}


def example_size(ctx: Any, dim_name: str) -> int | None:
    from harness.worker.inputs import iter_dims

    for key, d, n in iter_dims(ctx.dims):
        if n == dim_name:
            return int(ctx.spec.example.node(key).shape[d])
    return None


def zero_one_note(dim_name: str, size: int, what: str) -> str:
    """The 0/1 specialisation, named, with the fix."""
    return (f"{dim_name} has example size {size}, and torch.export specialises example sizes 0 and 1: "
            f"that {what}; give an example with {dim_name} >= 2 (or the case's own second_inputs for "
            "the sizes it must also run at)")
