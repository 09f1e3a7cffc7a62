"""matrix.yaml's ``pipelines:``: each pipeline an ordered list of steps, checked against the
catalogue (``harness.core.steps``) before anything is installed; and the judge of each pipeline's
parity (``JUDGES``, overridable per case with ``tolerances:``).

A step is written as its name (``onnxslim``), as a one-key mapping of its name to its arguments
(``{ort-fusion: {model_type: bert}}``), or as a user's own step ``module:function`` /
``file.py:function`` (with or without arguments). Each is normalised to
``{"step": name, "args": {...}}`` with every default filled in, which is what the worker gets.
"""
from __future__ import annotations

from typing import Any

from harness.core.cell import RAW_PIPELINE
from harness.core.steps import JUDGES, STEPS, is_user_step, precision_of

DEFAULT_PIPELINES: dict[str, list[Any]] = {RAW_PIPELINE: []}


class StepConfigError(ValueError):
    """A pipeline or step that cannot run: the key it is at and what was expected."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _arg(step: str, key: str, name: str, value: Any) -> Any:
    info = STEPS[step]
    default = info.args[name]
    choices = info.choices.get(name)
    if choices is not None:
        if value not in choices:
            raise StepConfigError(key, f"expected one of {list(choices)} (got {value!r})")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise StepConfigError(key, f"expected true or false (got {value!r})")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StepConfigError(key, f"expected a whole number >= 0 (got {value!r})")
    elif name == "op_block_list":
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
            raise StepConfigError(key, f"expected a list of ONNX operator names such as [Resize, Range] (got {value!r})")
    return value


def normalise_step(entry: Any, key: str) -> dict[str, Any]:
    """One step as written → ``{"step": name, "args": {...}}``."""
    if isinstance(entry, dict):
        if len(entry) != 1:
            raise StepConfigError(key, f"expected one step per entry, written as its name or as "
                                  f"{{name: {{argument: value}}}} (got keys {sorted(map(str, entry))})")
        (name, args), = entry.items()
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise StepConfigError(f"{key}.{name}", f"expected a mapping of arguments (got {args!r})")
    elif isinstance(entry, str):
        name, args = entry, {}
    else:
        raise StepConfigError(key, f"expected a step name such as 'onnxslim' (got {entry!r})")
    name = str(name)
    if name in STEPS:
        info = STEPS[name]
        unknown = sorted(set(map(str, args)) - set(info.args))
        if unknown:
            known = sorted(info.args) or "none"
            raise StepConfigError(f"{key}.{name}.{unknown[0]}", f"unknown argument of {name} (arguments: {known})")
        full = dict(info.args)
        full.update({a: _arg(name, f"{key}.{name}.{a}", a, v) for a, v in args.items()})
        return {"step": name, "args": full}
    if is_user_step(name):
        return {"step": name, "args": dict(args)}
    raise StepConfigError(key, f"unknown step {name!r}: expected one of {sorted(STEPS)} or a step of your "
                          "own as 'module:function' or 'file.py:function' (called function(src, dst))")


def check_pipelines(raw: Any) -> dict[str, list[dict[str, Any]]]:
    """matrix.yaml's ``pipelines`` → name → normalised steps (StepConfigError names the key)."""
    from harness.matrix.names import name_problem

    if not isinstance(raw, dict) or not raw:
        raise StepConfigError("pipelines", "expected a mapping of pipeline names to lists of steps, such as "
                              "{raw: [], slim: [onnxslim]}")
    out: dict[str, list[dict[str, Any]]] = {}
    for name, steps in raw.items():
        name = str(name)
        if why := name_problem(name):
            raise StepConfigError(f"pipelines.{name}", why)
        steps = [] if steps is None else steps
        if not isinstance(steps, list):
            raise StepConfigError(f"pipelines.{name}", f"expected a list of steps (got {steps!r})")
        if name == RAW_PIPELINE and steps:
            raise StepConfigError(f"pipelines.{name}", "'raw' is the exported file as it is: expected [] "
                                  "(give a pipeline with steps another name)")
        if name != RAW_PIPELINE and not steps:
            raise StepConfigError(f"pipelines.{name}", "expected at least one step (the empty pipeline is 'raw')")
        out[name] = [normalise_step(s, f"pipelines.{name}[{i}]") for i, s in enumerate(steps)]
    return out


def judge_for(steps: list[dict[str, Any]], overrides: dict[str, dict[str, Any]] | None) -> dict[str, Any] | None:
    """How a pipeline's parity is judged: None for an fp32 file (the case's own atol / rtol);
    else the precision's defaults (``JUDGES``) with the case's ``tolerances`` for it on top."""
    precision = precision_of(steps)
    if precision == "fp32":
        return None
    judge = {"class": precision, **JUDGES[precision]}
    judge.update({k: v for k, v in ((overrides or {}).get(precision) or {}).items() if v is not None})
    return judge
