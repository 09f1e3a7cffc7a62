"""Independent zoo verdicts: transformers + Optimum + torch.onnx + ONNX Runtime, no harness code.

Run inside an environment's python: ``python direct_zoo.py TRANSFORMERS_JSON OUT.jsonl TYPE ...``.
For each model type it builds the model the way the case list describes it (config class,
shrink overrides, the task's model class, random weights under seed 0, Optimum's dummy inputs),
then:

- ``dynamo``: plain ``torch.onnx.export(dynamo=True)`` of a module that calls the model with
  keywords and returns Optimum's outputs, the listed dynamic axes as ``Dim.DYNAMIC``;
- ``optimum``: Optimum's ``onnx_export_from_model`` (monolith, no validation);

then onnx's full check, ONNX Runtime at the example shape and at one grown by one along every
dynamic axis, each compared with eager (the case list's atol, rtol 1e-5, and the model's own
float32 noise as tests/direct_verdict.py judges it). One JSON verdict per line: {"model_type",
"exporter", "status", "stage", "error"}.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers
from direct_verdict import judge, noise_floors  # same folder: the plain-API judgement
from optimum.exporters.onnx import (
    model_configs,  # noqa: F401  (registers the ONNX configs)
    onnx_export_from_model,
)
from optimum.exporters.tasks import TasksManager


def build(model_type: str, entry: dict):
    if "compose" in entry:
        parts = []
        for part in entry["compose"]["configs"]:
            kw = {k: v for k, v in part.items() if k not in ("class", "model_type")}
            parts.append(getattr(transformers, part["class"])(**kw) if "class" in part
                         else transformers.AutoConfig.for_model(part["model_type"], **kw))
        config = getattr(transformers.CONFIG_MAPPING[model_type], entry["compose"]["method"])(*parts)
    else:
        config = transformers.AutoConfig.for_model(model_type, **entry.get("init", {}))
    for path, value in entry["config"].items():
        node, *rest = [config, *path.split(".")]
        for attr in rest[:-1]:
            node = getattr(node, attr)
        setattr(node, rest[-1], value)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    task = entry["task"]
    cls = TasksManager.get_model_class_for_task(task, model_type=model_type, library="transformers")
    torch.manual_seed(0)
    model = (cls.from_config(config) if hasattr(cls, "from_config") else cls(config)).eval()
    onnx_config = TasksManager.get_exporter_config_constructor(
        "onnx", model=model, task=task, library_name="transformers")(model.config)
    torch.manual_seed(0)
    dummy = onnx_config.rename_ambiguous_inputs(
        onnx_config.generate_dummy_inputs(framework="pt", **entry.get("shapes", {})))
    return model, onnx_config, dummy, task


class Outputs(torch.nn.Module):
    def __init__(self, model, keys, outputs):
        super().__init__()
        self.model, self.keys, self.outputs = model, keys, outputs

    def forward(self, *args):
        out = self.model(**dict(zip(self.keys, args)))
        return tuple(out[k] for k in self.outputs)


def grow(feeds: dict, axes: dict, growable: list[str]) -> dict:
    sizes, out = {}, {}
    for name, dims in axes.items():
        for d, a in dims.items():
            if a in growable and name in feeds:
                sizes.setdefault(a, feeds[name].shape[int(d)] + 1 if feeds[name].shape[int(d)] > 1 else 3)
    for name, x in feeds.items():
        for d, a in sorted(axes.get(name, {}).items()):
            if a in sizes:
                idx = torch.arange(sizes[a]) % x.shape[int(d)]
                x = x.index_select(int(d), idx)
        out[name] = x
    return out


def verdict(model_type: str, entry: dict, exporter: str, workdir: Path) -> dict:
    def result(status, stage=None, error=None):
        return {"model_type": model_type, "exporter": exporter, "status": status, "stage": stage,
                "error": error}

    model, onnx_config, dummy, task = build(model_type, entry)
    keys = [k for k in __import__("inspect").signature(model.forward).parameters if k in dummy]
    keys += [k for k in dummy if k not in keys]
    names = [onnx_config.torch_to_onnx_input_map.get(k, k) for k in keys]
    to_torch = {v: k for k, v in onnx_config.torch_to_onnx_output_map.items()}
    outputs = [to_torch.get(n, n) for n in onnx_config.outputs]
    wrapper = Outputs(model, keys, outputs).eval()
    axes = {k: onnx_config.inputs.get(n, {}) for k, n in zip(keys, names)}
    shapes = [dummy, grow(dummy, axes, entry["dynamic"])] if entry["dynamic"] else [dummy]
    with torch.no_grad():
        refs = [[o.numpy() for o in wrapper(*[x[k] for k in keys])] for x in shapes]
    path = workdir / f"{model_type}-{exporter}.onnx"
    try:
        if exporter == "dynamo":
            from torch.export import Dim

            ds = tuple({int(d): Dim.DYNAMIC for d, a in axes[k].items() if a in entry["dynamic"]} or None
                       for k in keys)
            torch.onnx.export(wrapper, tuple(dummy[k] for k in keys), str(path), dynamo=True, opset_version=18,
                              input_names=names, output_names=list(onnx_config.outputs),
                              dynamic_shapes={"args": ds})
        else:
            out = workdir / f"{model_type}-optimum"
            onnx_export_from_model(model, out, task=task, opset=18, monolith=True, do_validation=False,
                                   **entry.get("shapes", {}))
            (out / "model.onnx").rename(path)
    except Exception as e:
        return result("fail", "export", f"{type(e).__name__}: {e}"[:300])
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:
        return result("fail", "check", str(e)[:300])
    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:
        return result("fail", "load", str(e)[:300])
    graph_inputs = [i.name for i in sess.get_inputs()]
    atol, rtol = entry["atol"], 1e-5
    # the model's own float32 noise, judged as tests/direct_verdict.py does
    floors = noise_floors(wrapper, [(tuple(x[k] for k in keys), {}) for x in shapes], refs)
    for i, (x, ref) in enumerate(zip(shapes, refs)):
        feeds = {n: x[k].numpy() for k, n in zip(keys, names) if n in graph_inputs}
        try:
            got = sess.run(None, feeds)
        except Exception as e:
            return result("fail", "run", f"shape {i}: {e}"[:300])
        for j, (r, g) in enumerate(zip(ref, got)):
            try:
                assert r.shape == g.shape, "shape"
                if r.dtype.kind == "f":
                    judge(g, r, atol, rtol, floors[i][j] if floors[i] else None)
                else:
                    np.testing.assert_array_equal(g, r)
            except AssertionError:
                return result("fail", "parity", f"shape {i}: max diff "
                              f"{float(np.max(np.abs(g - r))) if r.shape == g.shape else 'shape'}")
    return result("pass")


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text())["architectures"]
    with tempfile.TemporaryDirectory() as tmp, open(sys.argv[2], "w") as out:
        for model_type in sys.argv[3:]:
            for exporter in ("dynamo", "optimum"):
                out.write(json.dumps(verdict(model_type, data[model_type], exporter, Path(tmp))) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
