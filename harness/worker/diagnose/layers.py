"""Which layer of the export stack broke a failing cell (worker side, after the blame ladder).

The ladder (``blame``) tells the file's side from the runtime's; this splits the file's side into
the layers that have different owners, each decided by an experiment or by evidence read from the
artefacts (the exception's frames, torch's guard log, the TracerWarnings of the export, the
exporter's registry, the file's function domains), never by the error text alone:

- ``model code``: a value-freezing TracerWarning on the model's own line with a file that is
  wrong (jit.trace, also torch.onnx 2.6's silent fallback), or a guard torch.export raised in the
  model's own frames: a documented limitation, noted to the model's owner;
- ``capture: torch.export`` / ``capture: jit.trace``: the guard or the frozen value is in torch's
  own code (a decomposition, ``nn.MultiheadAttention``);
- ``translation: torch`` / ``translation: onnxscript``: the owner of the translation (the registry
  the exporter dispatches from, the node's function domain or the aten target torch wrote on it);
- ``optimizer: onnxscript``: the same export with ``optimize=False`` passes;
- ``version converter: onnx`` / ``: onnxscript``: the export at the native opset passes, and
  ``onnx.version_converter`` alone reproduces the failure (onnx's) or not (onnxscript's);
- ``runtime: <runtime>``: the ladder's runtime parties;
- ``undetermined``: the evidence does not decide; ``experiments`` says what was tried.
"""
from __future__ import annotations

import re
from typing import Any

from harness.core.record import LAYERS, MODEL_OWNER, Blame, Record, runtime_repository
from harness.worker.diagnose import layer_experiments as ex
from harness.worker.diagnose import owners
from harness.worker.diagnose.onnx_reference import model_file
from harness.worker.diagnose.tracing import model_freezes

DOCS = {
    "tracing": "https://docs.pytorch.org/docs/stable/onnx_torchscript.html#tracing-vs-scripting",
    "cond": "https://docs.pytorch.org/docs/stable/cond.html",
    "export": "https://docs.pytorch.org/tutorials/intermediate/torch_export_tutorial.html",
    "dynamic": "https://docs.pytorch.org/docs/main/export/programming_model.html",
    "ts_ops": "https://docs.pytorch.org/docs/stable/onnx_torchscript_supported_aten_ops.html",
    "openvino_ops": "https://github.com/openvinotoolkit/openvino/blob/master/src/frontends/onnx/docs/supported_ops.md",
}
_DATA_DEPENDENT = re.compile(r"GuardOnDataDependentSymNode|data-dependent", re.I)
_GUARD = re.compile(r"Constraints violated|ConstraintViolation|GuardOnDataDependentSymNode|Could not guard on "
                    r"data-dependent|data-dependent expression|specialized it to be a constant|marked .* as dynamic "
                    r"but", re.I)
_LOCATIONS = re.compile(r'File "([^"]+)", line (\d+)|\(([^()\s]+\.py):(\d+) in \w+\)|File: (\S+?\.py):(\d+) in \w+')
_NODE_NAME = re.compile(r"(?:node\.? Name:\s*'|node name:\s*)([^',)]+)", re.I)
# OpenVINO's ONNX frontend documents these as supported "only in certain patterns".
_OPENVINO_PATTERN_OPS = re.compile(r"\bSequence(At|Construct|Insert|Empty|Length|Erase)|SplitToSequence|"
                                   r"ConcatFromSequence")


def set_layer(blame: Blame, layer: str, kind: str, reason: str | None = None, repository: str | None = None,
              docs: list[str] | None = None) -> Blame:
    """One place where a blame's layer, kind and repository are set together (and agree)."""
    blame.layer, blame.kind = layer, kind
    repo = repository if repository is not None else LAYERS.get(layer)
    blame.repository = None if repo == MODEL_OWNER else repo
    if layer == "model code":
        blame.party = "model-code"
    elif layer.startswith(("capture", "translation", "optimizer", "version converter", "exporter")):
        blame.party = "exporter"
    if docs:
        blame.docs = docs
    if reason:
        blame.reason = reason
    return blame


def refine(ctx: Any, cell: Any, rec: Record, blame: Blame) -> Blame:
    """Put the layer on a blame the ladder made (never raises past ``diagnose``'s guard)."""
    if rec.stage == "reference":
        return set_layer(blame, "model code", "bug")
    if rec.exporter == "optimum":
        return set_layer(blame, "exporter: optimum", "bug") if blame.party == "exporter" else blame
    if rec.stage == "export":
        return export_layer(ctx, rec, blame)
    if blame.party.startswith("runtime"):
        return runtime_layer(ctx, cell, rec, blame)
    if rec.stage == "check" or blame.party in ("exporter", "model-code"):
        return file_layer(ctx, rec, blame)
    blame.layer, blame.kind = "undetermined", "undetermined"
    return blame


# ---- export failures ---------------------------------------------------------------------------

def _locations(chain: list[BaseException], log: Any) -> list[str]:
    """'path:line' of every place torch names: in the exception messages and its guard log."""
    found = []
    for exc in chain:
        for m in _LOCATIONS.finditer(str(exc)):
            path, line = next((m.group(i), m.group(i + 1)) for i in (1, 3, 5) if m.group(i))
            found.append(f"{path}:{line}")
    for event in getattr(log, "events", None) or []:
        if event.get("at"):
            found.append(event["at"])
    return found


def _innermost_frame(exc: BaseException) -> str | None:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return last


def export_layer(ctx: Any, rec: Record, blame: Blame) -> Blame:
    from harness.core.errors import exception_chain

    failure = getattr(ctx, "failure", None)
    if failure is None:
        return set_layer(blame, "undetermined", "undetermined")
    chain = exception_chain(failure.exc)
    text = " <- ".join(f"{type(e).__name__}: {e}" for e in chain)
    tried = blame.experiments
    if _GUARD.search(text):
        places = _locations(chain, getattr(ctx, "export_log", None))
        model = [p for p in places if model_file(p.rsplit(":", 1)[0])]
        facts = [f["source"] for f in getattr(ctx, "export_facts", []) or [] if f.get("source")]
        tried.append({"experiment": "where the guard was raised", "outcome": "read",
                      "detail": f"locations torch names: {places[:6]}; the model's: {model[:2] or facts[:2]}"})
        if model or facts:
            where = (model or facts)[0]
            blame.source = blame.source if blame.source and model_file(blame.source.split(":")[0]) else where
            data = _DATA_DEPENDENT.search(text) is not None
            what = "data-dependent branch or value" if data else "size-dependent code"
            # the export log's fact (the dim, its value and the remedy that fits) says it best
            reason = None if facts and not data else (
                f"torch.export cannot capture the model's own {what} at {where}: "
                + ("rewrite it with torch.cond" if data else "the model turns a dynamic size into a constant"))
            return set_layer(blame, "model code", "documented limitation", reason,
                             docs=[DOCS["cond"], DOCS["export"]] if data else [DOCS["dynamic"]])
        if places:
            blame.source = None
            return set_layer(blame, "capture: torch.export", "bug",
                             f"torch.export fixed or guarded a dynamic size inside torch's own code ({places[0]}), "
                             "not in the model's frames: the capture's bug")
        return set_layer(blame, "undetermined", "undetermined",
                         "a guard stopped torch.export, but neither the exception nor torch's guard log names "
                         "where (tried: the exception's messages, torch's symbolic-shapes log)")
    if (ts := owners.torchscript_operator(text)) is not None:
        opsets = owners.torchscript_symbolic_opsets(ts[0])
        tried.append({"experiment": "torch's TorchScript symbolic registry", "outcome": "read",
                      "detail": f"{ts[0]}: symbolics at opsets {opsets}"})
        later = [o for o in opsets if o > ts[1]]
        return set_layer(blame, "translation: torch", "documented limitation",
                         f"torch's TorchScript exporter has no symbolic for {ts[0]} at opset {ts[1]}"
                         + (f" (it has one from opset {later[0]})" if later else ""), docs=[DOCS["ts_ops"]])
    if (target := owners.missing_target(text)) is not None:
        owner = owners.translation_owner(target)
        tried.append({"experiment": "the dynamo exporter's registry", "outcome": "read",
                      "detail": f"{target}: {owner.get('how')}"})
        layer = "translation: onnxscript" if owner.get("repository") == LAYERS["translation: onnxscript"] \
            else "translation: torch"
        return set_layer(blame, layer, "bug", f"no ONNX translation of {target} in the exporter's registry "
                         f"({owner.get('how')})")
    inner = _innermost_frame(chain[-1]) or ""
    pkg = owners.package_of(inner.rsplit(":", 1)[0]) if inner else None
    tried.append({"experiment": "the innermost frame of the export's exception", "outcome": "read", "detail": inner})
    if pkg == "model":
        return set_layer(blame, "model code", "bug", f"the model's own code raised while being exported ({inner})")
    if "step 3/3" in text or pkg == "onnxscript":
        return set_layer(blame, "translation: onnxscript" if pkg == "onnxscript" else "translation: torch", "bug")
    if rec.exporter == "torchscript":
        return set_layer(blame, "capture: jit.trace" if "/jit/" in inner else "translation: torch", "bug")
    if "step 1/3" in text or "step 2/3" in text:
        return set_layer(blame, "capture: torch.export", "bug")
    return set_layer(blame, "undetermined", "undetermined")


# ---- a file that is wrong ----------------------------------------------------------------------

def file_layer(ctx: Any, rec: Record, blame: Blame) -> Blame:
    tried = blame.experiments
    freezes = model_freezes(getattr(ctx, "tracer_warnings", []) or [])
    if freezes and rec.stage != "check":
        fallback = rec.exporter == "dynamo"
        tried.append({"experiment": "TracerWarnings of the export", "outcome": "read",
                      "detail": f"{len(freezes)} value-freezing warning(s) on the model's lines, first "
                                f"{freezes[0]['source']}" + ("; a dynamo export that traced: torch.onnx fell back "
                                                             "to jit.trace" if fallback else "")})
        return set_layer(blame, "model code", "documented limitation",
                         f"{'torch.onnx fell back to jit.trace after torch.export refused the model, and ' if fallback else ''}"
                         f"tracing froze the model's own value: {freezes[0]['message']} at {freezes[0]['source']}",
                         docs=[DOCS["tracing"]] + ([DOCS["cond"]] if fallback else []))
    if blame.party == "model-code":
        return set_layer(blame, "model code", "documented limitation", docs=[DOCS["dynamic"]])
    if rec.exporter == "torchscript":
        return _traced_layer(ctx, rec, blame)
    fixed = [f for f in (rec.graph or {}).get("specialised") or [] if isinstance(f, dict)]
    if fixed and "second shape" in (rec.error or ""):
        # the file fixes a dim the case declared dynamic, and no model line turned it into a
        # constant (the ladder would have said model-code): torch.export's capture fixed it
        tried.append({"experiment": "dims the file fixes", "outcome": "read",
                      "detail": "; ".join(str(f.get("note") or f) for f in fixed)[:300]})
        return set_layer(blame, "capture: torch.export", "bug", f"torch.export fixed a dim the case declared "
                         f"dynamic ({fixed[0].get('note') or fixed[0]}) with no line of the model's own code doing so")
    # dynamo: the optimizer, then the version converter, then the translation
    opt = ex.unoptimized(ctx)
    tried.append(opt)
    if opt["outcome"] == "passes":
        blame.remedies.append("optimize=False (tried: the same export passes)")
        return set_layer(blame, "optimizer: onnxscript", "bug", "the same export with optimize=False passes: "
                         "onnxscript's optimizer breaks the file")
    nat = ex.native(ctx)
    tried.append(nat)
    if nat["outcome"] == "passes":
        blame.remedies.append(f"opset {ex.NATIVE_OPSET} (tried: the native-opset export passes)")
        conv = nat.get("converter") or {}
        untouched = _file_opset(ctx) != rec.opset   # torch's converter call left the native file as it was
        onnx_fails = conv.get("outcome") == "fails" and not untouched
        return set_layer(blame, "version converter: onnx" if onnx_fails else "version converter: onnxscript", "bug",
                         f"the export at the native opset {ex.NATIVE_OPSET} passes and the file converted to opset "
                         f"{rec.opset} fails; onnx.version_converter alone "
                         + (f"reproduces it ({conv.get('detail', '')[:120]})" if onnx_fails
                            else f"is not what failed (the cell's file is at opset {_file_opset(ctx)}: onnxscript's "
                                 "conversion path torch calls returned it unconverted)" if untouched
                            else "does not reproduce it (onnxscript's conversion path is at fault)"))
    return _translation_layer(ctx, rec, blame)


def _file_opset(ctx: Any) -> int | None:
    import onnx

    model = onnx.load(str(ctx.onnx_path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _failing_node(ctx: Any, rec: Record, blame: Blame) -> str | None:
    texts = [rec.error or ""] + [str(r.get("detail", "")) for r in blame.evidence]
    for t in texts:
        if (node := owners.checker_node(t)) is not None:
            return node[1]
        if m := _NODE_NAME.search(t):
            return m.group(1).strip()
    div = blame.divergence or {}
    return div.get("node") or div.get("name")


def _translation_layer(ctx: Any, rec: Record, blame: Blame) -> Blame:
    node = _failing_node(ctx, rec, blame)
    owner = owners.node_owner(ctx.onnx_path, node) if node else None
    blame.experiments.append({"experiment": "owner of the failing node", "outcome": "read" if owner else "not found",
                              "detail": str(owner or f"node {node!r}")[:300]})
    if owner and owner.get("repository"):
        layer = "translation: onnxscript" if owner["repository"] == LAYERS["translation: onnxscript"] \
            else "translation: torch"
        return set_layer(blame, layer, "bug", f"{blame.reason}; the failing node {node} was written by "
                         f"{owner.get('function') or owner.get('target')} ({owner.get('how')})")
    return set_layer(blame, "undetermined", "undetermined", f"{blame.reason}; optimize=False and the native opset "
                     "fail too, and no owner of the failing node was found")


def _traced_layer(ctx: Any, rec: Record, blame: Blame) -> Blame:
    """TorchScript: the file is wrong and no model line froze a value: torch's capture (or its
    symbolics, for a file the checker rejects), pytorch/pytorch either way."""
    if rec.stage == "check" or "second shape" not in (rec.error or ""):
        # wrong at the example itself: not a value frozen from the example, the translation
        blame.experiments.append({"experiment": "shape the file fails at", "outcome": "read",
                                  "detail": "the checker rejects the file" if rec.stage == "check" else
                                  "wrong at the example shape: no frozen example value explains it"})
        return set_layer(blame, "translation: torch", "bug", f"torch's TorchScript symbolics write a file that "
                         f"does not compute what the model does: {blame.reason[:200]}")
    node = _failing_node(ctx, rec, blame)
    scope = node.strip("/").split("/")[0] if node and node.startswith("/") else None
    module = dict(ctx.spec.model.named_modules()).get(scope) if scope and hasattr(ctx.spec.model, "named_modules") else None
    cls = f"{type(module).__module__}.{type(module).__qualname__}" if module is not None else None
    blame.experiments.append({"experiment": "TracerWarnings and the failing node's module", "outcome": "read",
                              "detail": f"no value-freezing warning on the model's lines; node {node!r} in {cls or 'an unknown module'}"})
    where = f" in torch's {cls}" if cls and cls.startswith("torch.") else ""
    return set_layer(blame, "capture: jit.trace", "bug", f"jit.trace recorded a value of the example as a constant"
                     f"{where} (no TracerWarning on the model's own lines): {blame.reason[:200]}")


# ---- runtime -----------------------------------------------------------------------------------

def runtime_layer(ctx: Any, cell: Any, rec: Record, blame: Blame) -> Blame:
    layer = f"runtime: {rec.runtime}"
    repo = runtime_repository(rec.runtime)
    if rec.runtime.startswith("openvino") and _OPENVINO_PATTERN_OPS.search(rec.error or ""):
        return set_layer(blame, layer, "documented limitation", repository=repo, docs=[DOCS["openvino_ops"]],
                         reason=f"{blame.reason}; OpenVINO's ONNX frontend documents sequence operators as "
                                "supported only in certain patterns")
    if rec.stage == "load" and "pkg.onnxscript" in (rec.error or ""):
        result = ex.inlined(ctx, lambda p: _runtime_loads(ctx, cell, p))
        blame.experiments.append(result)
        if result["outcome"] == "passes":
            blame.remedies.append("inline the file's local functions (onnx.inliner.inline_local_functions): "
                                  "tried, the runtime then loads and agrees with eager")
    return set_layer(blame, layer, "bug", repository=repo)


def _runtime_loads(ctx: Any, cell: Any, path: Any) -> dict[str, Any]:
    import numpy as np

    from harness.runtimes import load_adapter
    from harness.runtimes.base import match_feeds
    from harness.worker.parity import first_difference

    adapter = load_adapter(cell.runtime_name)(path, threads=ctx.job.threads, precision="fp32",
                                              options=cell.runtime_options)
    adapter.prepare([{n: tuple(v.shape) for n, v in f.items()} for f in ctx.feeds])
    with adapter:
        names = adapter.input_names()
        outs = [[np.asarray(o) for o in adapter.infer(match_feeds(f, names))] for f in ctx.feeds]
    differs = first_difference(ctx.references, outs, ctx.spec.atol, ctx.spec.rtol)
    return {"outcome": "fails" if differs else "passes", "detail": (differs or "agrees with eager")[:300]}
