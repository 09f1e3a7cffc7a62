"""transformers architectures as cases, one per model type Optimum exports to ONNX.

``harness.probes.zoo.hf:<model_type>`` (``-`` as ``_``) builds the architecture's model for its
default task, ``hf:<model_type>__<task>`` for another task (``-`` as ``_``). Each case is built
as Optimum would export it, without downloading anything:

- the config class with its defaults (``AutoConfig.for_model``), shrunk by the overrides stored in
  ``transformers.json`` (``shrink.py``), random weights under a fixed seed (``from_config``);
- the model class Optimum's ``TasksManager`` picks for the task;
- the inputs Optimum's ONNX config generates (its dummy input generators, seeded), in the order
  of the model's forward signature, with the input and output names of that ONNX config, its
  dynamic axes (those the eager model accepts at another size: ``transformers.json``'s
  ``dynamic``) and its validation tolerance (``ATOL_FOR_VALIDATION``; ``rtol`` is that of
  ``np.allclose``, which Optimum's validation uses).

The returned model takes the inputs positionally and returns Optimum's outputs as a tuple: what a
user writes to call ``torch.onnx.export`` on a transformers model. It carries what the ``optimum``
exporter needs (``harness/worker/export_optimum.py``): the transformers model, task and shapes.
Architectures that cannot be built here are cases that raise ``ImportError`` with the reason
(a ``skip``).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from harness.probes.zoo import case_function, transformers_entries

# Nothing is downloaded: no Hub look-ups from transformers or Optimum inside a worker.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_var, "1")

RTOL = 1e-5  # np.allclose's default, which Optimum's validate_model_outputs uses with its atol


class Unbuildable(ImportError):
    """The architecture cannot be built in this environment (a ``skip`` with this reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def tasks_manager() -> Any:
    """Optimum's TasksManager with the ONNX configs registered (importing them registers them)."""
    import optimum.exporters.onnx.model_configs  # noqa: F401 - imported for its side effect: it registers the ONNX configs
    from optimum.exporters.tasks import TasksManager

    return TasksManager


def onnx_config_for(model: Any, task: str) -> Any:
    TasksManager = tasks_manager()

    ctor = TasksManager.get_exporter_config_constructor(
        "onnx", model=model, task=task, library_name="transformers")
    return ctor(model.config, int_dtype="int64", float_dtype="fp32")


def make_config(model_type: str, overrides: dict[str, Any] | None = None,
                init: dict[str, Any] | None = None, compose: dict[str, Any] | None = None) -> Any:
    """The config class's defaults (``init``: constructor keywords), or a composite config made
    from sub-configs (``compose``: {"method": ..., "configs": [{"model_type": ...}, ...]}), then
    the shrink ``overrides``."""
    from transformers import AutoConfig

    from harness.probes.zoo.shrink import apply

    if compose:
        import transformers
        from transformers import CONFIG_MAPPING

        parts = [getattr(transformers, part["class"])(**{k: v for k, v in part.items() if k != "class"})
                 if "class" in part else AutoConfig.for_model(**part) for part in compose["configs"]]
        config = getattr(CONFIG_MAPPING[model_type], compose["method"])(*parts)
    else:
        config = AutoConfig.for_model(model_type, **(init or {}))
    return apply(config, overrides or {})


def config_of(model_type: str, entry: dict[str, Any]) -> Any:
    return make_config(model_type, entry.get("config"), entry.get("init"), entry.get("compose"))


def save_preprocessor(model_type: str, spec: dict[str, Any] | None, config: Any) -> None:
    """Some of Optimum's dummy input generators read the model folder's preprocessor (crop size,
    tokenizer): write the one ``spec`` names to a folder and point the config at it, as a model
    saved with ``save_pretrained`` next to its preprocessor would be."""
    if not spec:
        return
    import tempfile
    from pathlib import Path

    import transformers

    folder = Path(tempfile.gettempdir()) / "harness-zoo-preprocessors" / model_type
    folder.mkdir(parents=True, exist_ok=True)
    getattr(transformers, spec["class"])(**spec.get("kwargs", {})).save_pretrained(str(folder))
    config.save_pretrained(str(folder))
    config._name_or_path = str(folder)


def make_model(model_type: str, task: str, config: Any) -> Any:
    import torch

    TasksManager = tasks_manager()
    if not task.endswith("-with-past") and hasattr(config, "use_cache"):
        config.use_cache = False   # what Optimum's ONNX config overrides for a task without past
    config.return_dict = True
    model_class = TasksManager.get_model_class_for_task(
        task, framework="pt", model_type=model_type, library="transformers")
    torch.manual_seed(0)
    if hasattr(model_class, "from_config"):       # an Auto class
        return model_class.from_config(config).eval()
    return model_class(config).eval()             # a concrete model class


def dummy_inputs(onnx_config: Any, shapes: dict[str, int]) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    inputs = onnx_config.generate_dummy_inputs(framework="pt", **shapes)
    return onnx_config.rename_ambiguous_inputs(inputs)


def ordered_names(model: Any, onnx_config: Any, inputs: dict[str, Any]) -> list[tuple[str, str]]:
    """(forward keyword, ONNX input name) in the forward signature's order, as Optimum orders them."""
    import inspect

    params = list(inspect.signature(model.forward).parameters)
    order = [k for p in params for k in inputs if k == p]
    order += [k for k in inputs if k not in order]
    return [(k, onnx_config.torch_to_onnx_input_map.get(k, k)) for k in order]


def output_keys(onnx_config: Any) -> list[tuple[str, str]]:
    """(ModelOutput key, ONNX output name) for every output of the ONNX config."""
    onnx_to_torch = {v: k for k, v in onnx_config.torch_to_onnx_output_map.items()}
    return [(onnx_to_torch.get(name, name), name) for name in onnx_config.outputs]


def build(model_type: str, task: str | None = None):
    """(model, inputs, dynamic_dims) for one architecture; attributes carry names and tolerance."""
    entry = transformers_entries().get(model_type)
    if entry is None:
        raise Unbuildable(f"{model_type!r} is not in harness/probes/zoo/transformers.json")
    task = task or entry["task"]
    if entry.get("unbuildable"):
        raise Unbuildable(entry["unbuildable"])
    if task in entry.get("task_skips", {}):
        raise Unbuildable(entry["task_skips"][task])
    _require("transformers", "optimum.exporters.onnx")
    import torch  # noqa: F401  (after the checks: the reason names the missing package)

    from harness.probes.zoo.modules import KeywordModel

    config = config_of(model_type, entry)
    model = make_model(model_type, task, config)
    save_preprocessor(model_type, entry.get("preprocessor"), model.config)
    onnx_config = onnx_config_for(model, task)
    shapes = dict(entry.get("shapes", {}))
    inputs = dummy_inputs(onnx_config, shapes)
    names = ordered_names(model, onnx_config, inputs)
    axes = onnx_config.inputs
    growable = set(entry.get("dynamic", []))
    dims = {}
    for i, (_, onnx_name) in enumerate(names):
        named = {int(d): n for d, n in axes.get(onnx_name, {}).items() if n in growable}
        if named:
            dims[i] = named
    wrapper = KeywordModel(model, [k for k, _ in names], output_keys(onnx_config)).eval()
    wrapper.onnx_input_names = [n for _, n in names]
    wrapper.onnx_output_names = list(onnx_config.outputs)
    wrapper.optimum_export = {"model_type": model_type, "task": task, "shapes": shapes,
                              "atol": atol_of(onnx_config, task)}
    return wrapper, tuple(inputs[k] for k, _ in names), dims


def atol_of(onnx_config: Any, task: str) -> float:
    atol = onnx_config.ATOL_FOR_VALIDATION
    if isinstance(atol, dict):
        atol = atol[task.replace("-with-past", "")]
    return float(atol)


def _require(*modules: str) -> None:
    import importlib.util

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise Unbuildable(f"package {name.split('.')[0]!r} ({name}) is not installed in this environment")


def case(model_type: str, task: str | None = None) -> Callable[[], Any]:
    """The case function of one architecture (and task)."""
    entry = transformers_entries().get(model_type, {})

    def fn():
        return build(model_type, task)

    fn.__name__ = case_function(model_type, task if task != entry.get("task") else None)
    fn.__doc__ = f"transformers {model_type} ({task or entry.get('task')}), tiny random weights"
    fn.atol = float(entry.get("atols", {}).get(task or entry.get("task"), entry.get("atol", 1e-4)))
    fn.rtol = RTOL
    return fn


def __getattr__(name: str) -> Callable[[], Any]:
    """``hf:<function>`` → the case function of that architecture and task."""
    from harness.probes.zoo import parse_case_function

    parsed = parse_case_function(name)
    if parsed is None:
        raise AttributeError(name)
    return case(*parsed)
