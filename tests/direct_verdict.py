"""Independent verdicts: plain torch.onnx.export + onnx checker + ONNX Runtime, no harness code.

Run inside an environment's python: ``python direct_verdict.py CELLS.json OUT.jsonl`` where the file lists
{"case_file", "case_fn", "exporter", "opset"} items; writes one JSON verdict per line, each item
exported in a process forked for it alone. Tests compare
these with the harness's records: a harness `pass` that this script fails is the bug we fear most.

Cases may return nested and keyword inputs (see harness/worker/cases.py for the contract); this
script reads them with its own few lines. Dynamic dims reach torch as its documentation asks:
``dynamic_axes`` keyed by input name for TorchScript, ``dynamic_shapes`` shaped like the inputs
for ``dynamo=True`` (where torch 2.13 calls ``dynamic_axes`` deprecated), each dim marked as the
release itself converts a ``dynamic_axes`` name. The second shape is the case's ``second_inputs`` or the
example grown by one in every dynamic dim (an empty dim to 1, a dim of 1 to 3), entries repeated in
place (positions keep counting, lengths padded to the longest keep reaching the padded size; an
empty dim gets fresh entries); when eager refuses it, only the example shape is checked. Outputs
are compared with the item's atol / rtol and against the model's own float32 noise, measured as
float32 eager against a float64 copy of the model: beyond the tolerance but within 10 times that
floor passes, within it but more than 1000 times the floor and 1 % of the value fails.
"""
from __future__ import annotations

import atexit
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

warnings.filterwarnings("ignore")
# One folder per process: other test sessions may run this script at the same time.
WORKDIR = Path(tempfile.mkdtemp(prefix="direct-verdict-"))
atexit.register(shutil.rmtree, WORKDIR, True)


def load(path: str, fn: str):
    spec = importlib.util.spec_from_file_location("direct_case", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, dict):
        return any(has_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(has_tensor(v) for v in x)
    return False


def as_args(x) -> tuple:
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def read_case(fn):
    """(model, args, kwargs, dims as given, second inputs as (args, kwargs) or None)."""
    torch.manual_seed(0)
    res = list(fn())
    model, first = res[0], res[1]
    rest = res[2:]
    if isinstance(first, dict):
        args, kwargs = (), dict(first)
    else:
        args, kwargs = as_args(first), {}
        if rest and isinstance(rest[0], dict) and (has_tensor(rest[0]) or (not rest[0] and len(rest) > 1)):
            kwargs = rest.pop(0)
    dims = rest.pop(0) if rest else None
    second = rest.pop(0) if rest else getattr(fn, "second_inputs", None)
    second = second() if callable(second) else second
    if second is not None:
        if args and kwargs:
            second = (as_args(second[0]), dict(second[1]))
        elif kwargs:
            second = ((), dict(second))
        else:
            second = (as_args(second), {})
    model.eval()
    params = list(inspect.signature(model.forward).parameters)
    kwargs = {k: kwargs[k] for k in [p for p in params if p in kwargs] + [k for k in kwargs if k not in params]}
    if second is not None:
        second = (second[0], {k: second[1][k] for k in kwargs})
    return model, args, kwargs, dims, second, params


def leaves(args, kwargs):
    """[(name, tensor or value, (top, *path))] in graph-input order."""
    out = []

    def walk(x, name, key):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{name}_{k}", key + (k,))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{name}_{i}", key + (i,))
        else:
            out.append((name, x, key))

    for i, a in enumerate(args):
        walk(a, f"input_{i}", (i,))
    for k, v in kwargs.items():
        walk(v, k, (k,))
    return out


def resolve(dims, args, kwargs, params):
    """dynamic dims (index, 'path', or nested structure) → {leaf key: {dim: name}}."""
    out = {}

    def is_map(d):
        return isinstance(d, dict) and d and all(isinstance(k, int) for k in d) and \
            all(isinstance(v, str) for v in d.values())

    def node(key):
        x = args[key[0]] if isinstance(key[0], int) else kwargs[key[0]]
        for k in key[1:]:
            x = x[k]
        return x

    def put(key, spec):
        if spec is None:
            return
        if is_map(spec):
            out[key] = {d % node(key).dim(): n for d, n in spec.items()}
        elif isinstance(spec, dict):
            for k, v in spec.items():
                put(key + (k,), v)
        else:
            for i, v in enumerate(spec):
                put(key + (i,), v)

    if isinstance(dims, (list, tuple)):
        tops = list(range(len(args))) + list(kwargs)
        for top, spec in zip(tops, dims):
            put((top,), spec)
        return out
    for k, spec in (dims or {}).items():
        if isinstance(k, int):
            put((k,), spec)
            continue
        first, *rest = k.split(".")
        top = first if first in kwargs else (params.index(first) if first in params else int(first))
        put((top, *(int(p) if p.isdigit() else p for p in rest)), spec)
    return out


def grow(inputs, dims):
    """Legacy helper (positional tensors, {index: {dim: name}}), kept for direct_openvino.py."""
    args, _ = grow_structured(tuple(inputs), {}, {(i,): d for i, d in dims.items()})
    return args


def grow_structured(args, kwargs, dims):
    old = {}
    for key, ds in dims.items():
        for d, n in ds.items():
            old.setdefault(n, leaf_at(args, kwargs, key).shape[d])
    new = {n: 1 if s == 0 else (3 if s == 1 else s + 1) for n, s in old.items()}

    def grow_one(x, ds):
        for d, n in sorted(ds.items()):
            size = new[n]
            if x.shape[d] == 0:
                shape = list(x.shape)
                shape[d] = size
                x = torch.randn(shape, dtype=x.dtype) if x.is_floating_point() else torch.zeros(shape, dtype=x.dtype)
            elif not x.is_floating_point() and x.dtype != torch.bool and x.shape[d] > 1 and \
                    (x.narrow(d, 0, 1) == 0).all() and (torch.diff(x, dim=d) == 1).all():
                shape = [-1 if i == d else 1 for i in range(x.dim())]
                x = x.narrow(d, 0, 1) + torch.arange(size).reshape(shape).to(x.dtype)
            else:
                x = x.index_select(d, torch.arange(size) * x.shape[d] // size)
        if x.dim() == 1 and not x.is_floating_point() and x.dtype != torch.bool and x.numel() and int(x.max()) > 1:
            for n in old:
                if n not in ds.values() and old[n] >= 2 and int(x.max()) == old[n]:
                    x = torch.where(x == old[n], torch.full_like(x, new[n]), x)
                    break
        return x

    def rebuild(x, key):
        if isinstance(x, dict):
            return {k: rebuild(v, key + (k,)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(rebuild(v, key + (i,)) for i, v in enumerate(x))
        return grow_one(x, dims[key]) if key in dims else x

    return (tuple(rebuild(a, (i,)) for i, a in enumerate(args)),
            {k: rebuild(v, (k,)) for k, v in kwargs.items()})


def leaf_at(args, kwargs, key):
    x = args[key[0]] if isinstance(key[0], int) else kwargs[key[0]]
    for k in key[1:]:
        x = x[k]
    return x


def flat(o):
    if isinstance(o, torch.Tensor):
        return [o.detach().numpy()]
    if isinstance(o, dict):
        return [y for x in o.values() if x is not None for y in flat(x)]
    if isinstance(o, (list, tuple)):
        return [y for x in o for y in flat(x)]
    return []


def export_plain(model, inputs, dims, exporter: str, opset: int, path: str, kwargs=None, names=None,
                 dims_by_name=None, policy=None):
    """torch.onnx.export as a user calls it: ``dynamic_axes`` by input name, with either exporter;
    with a dim policy (dynamo), ``dynamic_shapes`` marked Dim.DYNAMIC / Dim.AUTO / Dim("name")
    per positional input. Returns what torch.onnx.export returns.

    Older callers pass positional ``inputs`` and ``dims`` as {index: {dim: name}}.
    """
    kwargs = kwargs or {}
    if names is None:
        names = [f"input_{i}" for i in range(len(inputs))]
        dims_by_name = {f"input_{i}": d for i, d in dims.items()}
    inputs = tuple(inputs)
    if not kwargs and inputs and isinstance(inputs[-1], dict):
        # torch.onnx.export reads a trailing dict as keyword inputs: the documented escape for
        # TorchScript is an empty dict after it; dynamo takes it by its parameter name.
        if exporter == "torchscript":
            inputs = inputs + ({},)
        else:
            param = list(inspect.signature(model.forward).parameters)[len(inputs) - 1]
            inputs, kwargs = inputs[:-1], {param: inputs[-1]}
    extra = {"kwargs": kwargs} if kwargs else {}
    if exporter == "torchscript":
        return torch.onnx.export(model, inputs, path, opset_version=opset, dynamo=False, input_names=names,
                                 dynamic_axes=dims_by_name or None, **extra)
    if policy is not None:
        from torch.export import Dim

        named = {}
        mark = {"dynamic": lambda n: Dim.DYNAMIC, "auto": lambda n: Dim.AUTO,
                "named": lambda n: named.setdefault(n, Dim(n))}[policy]
        ds = shapes_like(inputs, kwargs, names, dims_by_name, model, mark) if dims_by_name else None
        return torch.onnx.export(model, inputs, path, opset_version=opset, dynamo=True, input_names=names,
                                 dynamic_shapes=ds, **extra)
    import re

    if not dims_by_name or tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups()) < (2, 8):
        # Before 2.8 torch.onnx.export documents dynamic_axes for dynamo too: every input named,
        # in order (torch 2.6 unflattens the converted shapes in dict order).
        axes = {n: dims_by_name.get(n) for n in names} if dims_by_name else None
        return torch.onnx.export(model, inputs, path, opset_version=opset, dynamo=True, input_names=names,
                                 dynamic_axes=axes, **extra)
    # dynamo=True takes dims as ``dynamic_shapes`` (torch.onnx.export's documentation: dynamic_axes
    # is deprecated there): one entry per input, shaped like it, each dim marked as the release
    # itself converts a dynamic_axes name (up to 2.6 Dim(letters of the name, max=99999), one per
    # name; 2.7 Dim.AUTO; 2.8 on Dim.DYNAMIC).
    return torch.onnx.export(model, inputs, path, opset_version=opset, dynamo=True, input_names=names,
                             dynamic_shapes=shapes_like(inputs, kwargs, names, dims_by_name, model, release_mark()),
                             **extra)


def release_mark():
    """What torch.onnx.export(dynamo=True) makes of a dynamic_axes name in this release."""
    import re

    from torch.export import Dim

    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    if (major, minor) >= (2, 8):
        return lambda name: Dim.DYNAMIC
    if (major, minor) == (2, 7):
        return lambda name: Dim.AUTO
    named = {}
    return lambda name: named.setdefault(name, Dim(re.sub(r"[^A-Za-z_]", "", name), max=99999))


def shapes_like(args, kwargs, names, dims_by_name, model, mark):
    """``dynamic_shapes`` mirroring the inputs: {dim: mark} at each leaf named in ``dims_by_name``
    (leaves named as ``leaves`` names them), None at every other leaf; a tuple over the
    positional inputs, or, with keyword inputs, a dict by ``forward``'s parameter names."""
    it = iter(names)

    def mirror(x):
        if isinstance(x, dict):
            return {k: mirror(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(mirror(v) for v in x)
        if isinstance(x, torch.Tensor):
            name = next(it)
            return {d: mark(n) for d, n in dims_by_name[name].items()} if name in dims_by_name else None
        return None

    tops = [mirror(a) for a in args]
    if not kwargs:
        return tuple(tops)
    params = list(inspect.signature(model.forward).parameters)
    return {**dict(zip(params, tops)), **{k: mirror(v) for k, v in kwargs.items()}}


def fixed_dims(program, path: str, dims_by_name, names) -> tuple[dict, dict]:
    """Declared dynamic dims the file fixes (a number in the file's inputs; a dim_param is a
    symbol whatever its name), and those only the exported program pins while the file keeps a
    symbol (a placeholder size that is an int or a one-value range): ({"input_0": {1: 6}}, {...})."""
    graph = onnx.load(path).graph
    ep = getattr(program, "exported_program", None)
    ranges = getattr(ep, "range_constraints", {}) or {}
    placeholders = []
    if ep is not None:
        vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
        placeholders = [vals.get(n) for n in ep.graph_signature.user_inputs]
    fixed, pinned = {}, {}
    for name, ds in (dims_by_name or {}).items():
        i = names.index(name)
        shape = graph.input[i].type.tensor_type.shape.dim
        for d in ds:
            if shape[d].HasField("dim_value"):
                fixed.setdefault(name, {})[d] = shape[d].dim_value
                continue
            if i < len(placeholders) and hasattr(placeholders[i], "shape"):
                size = placeholders[i].shape[d]
                rng = ranges.get(getattr(getattr(size, "node", None), "expr", None))
                value = size if isinstance(size, int) else (
                    int(rng.lower) if rng is not None and rng.lower == rng.upper else None)
                if value is not None:
                    pinned.setdefault(name, {})[d] = value
    return fixed, pinned


class KeepDouble(torch.overrides.TorchFunctionMode):
    """Inside the float64 copy, the model's own casts to float32 (``.float()``, ``.to(torch.float32)``,
    ``dtype=torch.float32``) stay float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in (kwargs or {}).items()}
        if func is torch.Tensor.float:
            return args[0].double()
        if func is torch.Tensor.to:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


def noise_floors(model, shapes, refs):
    """Per shape and output: max |float32 eager - float64 eager| (the float64 copy keeping its own
    casts to float32 at float64), at least one float32 step of the output's largest value; None
    where the model does not run in float64."""
    import copy

    try:
        twin = copy.deepcopy(model).double()

        def cast(x):
            return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        out = []
        with torch.no_grad(), KeepDouble():
            for (a, k), ref in zip(shapes, refs):
                r64 = flat(twin(*map_tensors(a, cast), **map_tensors(k, cast)))
                floors = []
                for r, e in zip(ref, r64):
                    if r.dtype.kind != "f" or r.shape != e.shape:
                        floors.append(None)
                        continue
                    fin = np.isfinite(r) & np.isfinite(e)
                    scale = float(np.abs(e[fin]).max()) if fin.any() else 0.0
                    gap = float(np.abs(r.astype(np.float64) - e)[fin].max()) if fin.any() else 0.0
                    floors.append(max(gap, float(np.finfo(np.float32).eps) * scale) or None)
                out.append(floors)
        return out
    except Exception:
        return [None] * len(refs)


def map_tensors(x, fn):
    if isinstance(x, dict):
        return {k: map_tensors(v, fn) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(map_tensors(v, fn) for v in x)
    return fn(x)


def judge(o, r, atol, rtol, floor):
    """assert_allclose, and the model's own noise: beyond atol/rtol but within 10 floors passes
    (when the floor is under 0.1 % of the output's scale); within them but over 1000 floors and
    1 % of the value at the worst element fails."""
    o64, r64 = o.astype(np.float64), r.astype(np.float64)
    fin = np.isfinite(r64) & np.isfinite(o64)
    diff = np.where(fin, np.abs(o64 - r64), 0.0)
    try:
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
    except AssertionError:
        scale = float(np.abs(r64[fin]).max()) if fin.any() else 0.0
        if floor and diff.size and diff.max() <= 10 * floor and floor <= 1e-3 * scale and \
                np.array_equal(np.isnan(o64), np.isnan(r64)):
            return
        raise
    if floor and diff.size and r.dtype.kind == "f":
        at = np.unravel_index(int(diff.argmax()), diff.shape)
        rel = diff[at] / max(abs(r64[at]), 1e-300)
        assert not (diff[at] > 1000 * floor and rel > 1e-2), f"divergence: {diff[at]:.3g} is {diff[at] / floor:.3g} floors"


def verdict(item) -> dict:
    model, args, kwargs, dims, second, params = read_case(load(item["case_file"], item["case_fn"]))
    keyed = resolve(dims, args, kwargs, params)
    tensors = [(n, v, k) for n, v, k in leaves(args, kwargs) if isinstance(v, torch.Tensor)]
    names = [n for n, _, _ in tensors]
    by_name = {n: keyed[k] for n, _, k in tensors if k in keyed}
    path = str(WORKDIR / "model.onnx")
    shapes = [(args, kwargs)]
    if second is not None:
        shapes.append(second)
    elif keyed:
        shapes.append(grow_structured(args, kwargs, keyed))
    with torch.no_grad():
        refs = [flat(model(*args, **kwargs))]
        if len(shapes) > 1:
            try:
                refs.append(flat(model(*shapes[1][0], **shapes[1][1])))
            except Exception:
                shapes = shapes[:1]   # eager refuses the second shape: the example decides
    try:
        program = export_plain(model, args, None, item["exporter"], item["opset"], path, kwargs=kwargs,
                               names=names, dims_by_name=by_name, policy=item.get("dim_policy"))
    except Exception as e:
        return export_failure(e)
    fixed, pinned = fixed_dims(program, path, by_name, names)
    # how torch captured the graph (dynamo), as torch itself records it on the ONNXProgram
    capture = getattr(program, "_capture_strategy", None)
    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:
        return {"stage": "check", "status": "fail", "error": str(e)[:200], "fixed": fixed, "pinned": pinned, "capture": capture}
    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:
        return {"stage": "load", "status": "fail", "error": str(e)[:200], "fixed": fixed, "pinned": pinned, "capture": capture}
    graph_inputs = [i.name for i in sess.get_inputs()]
    outs = []
    for a, k in shapes:
        values = [v for _, v, _ in leaves(a, k) if isinstance(v, torch.Tensor)]
        feed = {n: t.numpy() for n, t in zip(names, values) if n in graph_inputs}
        try:
            outs.append(sess.run(None, feed))
        except Exception as e:
            return {"stage": "run", "status": "fail", "error": str(e)[:200], "fixed": fixed, "pinned": pinned, "capture": capture}
    floors = noise_floors(model, shapes, refs)
    for ref, out, shape_floors in zip(refs, outs, floors):
        try:
            assert len(ref) == len(out), "output count"
            for j, (r, o) in enumerate(zip(ref, out)):
                assert r.shape == o.shape and r.dtype == o.dtype, f"shape/dtype {o.shape} vs eager {r.shape}"
                judge(o, r, item.get("atol", 1e-4), item.get("rtol", 1e-3), shape_floors[j] if shape_floors else None)
        except AssertionError as e:
            return {"stage": "parity", "status": "fail", "error": str(e)[:200], "fixed": fixed, "pinned": pinned,
                    "capture": capture}
    return {"stage": None, "status": "pass", "error": None, "checked_shapes": len(outs), "fixed": fixed,
            "pinned": pinned, "capture": capture}


def export_failure(e: BaseException) -> dict:
    """An export's failure, with the innermost error it was raised from (``__cause__`` chain)."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    first = str(root).strip().splitlines()[0] if str(root).strip() else ""
    return {"stage": "export", "status": "fail", "error": f"{type(e).__name__}: {e}"[:200],
            "root": f"{type(root).__name__}: {first}"[:300]}


def in_fresh_process(fn, item) -> dict:
    """``fn(item)`` in a process forked for it alone, so that no item sees what an earlier one
    left in the process (torch 2.13's export of some models depends on the exports before it).
    A process that dies is a ``crash``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            data = json.dumps(fn(item)).encode()
        except BaseException as e:
            data = json.dumps({"stage": None, "status": "crash", "error": repr(e)[:200]}).encode()
        while data:
            data = data[os.write(w, data):]
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"stage": None, "status": "crash", "error": f"process ended with status {status}"}
    return json.loads(b"".join(chunks))


def main(fn) -> None:
    with open(sys.argv[2], "w") as out:
        for item in json.load(open(sys.argv[1])):
            out.write(json.dumps({**item, **in_fresh_process(fn, item)}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(verdict)
