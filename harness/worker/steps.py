"""The post-export pipeline inside the worker: each step a thin call of the library that does it
(the catalogue is ``harness.core.steps``), run as stage ``step`` of the group, after the exported
file is checked and before any runtime loads it.

Each step reads ``src`` and writes ``dst`` (one file; a model over 2 GB keeps its tensors in
``dst.data``); a step that raises or writes nothing fails the cell at stage ``step``. After it: the
ONNX checker and strict shape inference (facts and notes: a runtime may still load the file, and
its own verdict on it is the cell's), node and op counts before and after, the fusions the step
reports, file size and seconds, in the graph fact ``pipeline``. Libraries are imported lazily.
"""
from __future__ import annotations

import importlib
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from harness.core.errors import short_error
from harness.core.steps import STEPS, is_user_step

ONE_FILE_LIMIT = 1_800_000_000   # bytes of tensors one protobuf file holds (2 GB, with room)


def save(model: Any, dst: Path) -> None:
    """Write an onnx ModelProto: one file, or ``dst`` + ``dst.data`` when it is too large for one."""
    import onnx

    large = model.ByteSize() > ONE_FILE_LIMIT
    onnx.save(model, str(dst), save_as_external_data=large, location=dst.name + ".data" if large else None)


def _load(src: Path) -> Any:
    import onnx

    return onnx.load(str(src))   # external data read from src's folder


def onnxscript_optimizer(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    import onnxscript.optimizer
    from onnxscript import ir

    model = onnxscript.optimizer.optimize(ir.load(str(src)))
    # ir.save keeps an external tensor's original relative location: load every tensor first.
    ir.external_data.load_to_model(model)
    save(ir.serde.serialize_model(model), dst)
    return {}


def onnxslim_step(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    import onnxslim

    save(onnxslim.slim(_load(src)), dst)
    return {}


def onnxsim_step(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    import onnxsim

    model, ok = onnxsim.simplify(_load(src))
    if not ok:
        raise RuntimeError("onnxsim could not validate the simplified model")
    save(model, dst)
    return {}


def ort_fusion(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(src), model_type=args["model_type"], num_heads=args["num_heads"],
                         hidden_size=args["hidden_size"], opt_level=args["opt_level"], use_gpu=False)
    stats = {k: int(v) for k, v in opt.get_fused_operator_statistics().items()}
    save(opt.model, dst)
    return {"fused": stats}


def fp16_occ(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    from onnxconverter_common import float16

    kw = {"op_block_list": args["op_block_list"]} if args.get("op_block_list") is not None else {}
    save(float16.convert_float_to_float16(_load(src), keep_io_types=args["keep_io_types"], **kw), dst)
    return {}


def fp16_ort(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    """As ONNX Runtime's optimizer users convert its result (``OnnxModel.convert_float_to_float16``,
    the float16 module's conversion with ONNX Runtime's own handling of the graph around it)."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    kw = {"op_block_list": args["op_block_list"]} if args.get("op_block_list") is not None else {}
    model = OnnxModel(_load(src))
    model.convert_float_to_float16(keep_io_types=args["keep_io_types"], **kw)
    save(model.model, dst)
    return {}


def cpu_has_vnni() -> bool | None:
    """Whether this x86 CPU has VNNI int8 dot products (AVX512-VNNI, AVX-VNNI or AMX); None where
    /proc/cpuinfo says nothing of x86 flags (another architecture, another OS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None or "sse2" not in flags:
        return None
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


# ONNX Runtime's quantization guide: on x86-64 without VNNI, its u8s8 int8 kernels (uint8
# activations, int8 weights, what quantize_dynamic writes for QInt8) can saturate; reduce_range
# (7-bit weights) avoids it. Measured on an AVX2 CPU without VNNI: a two-layer BERT encoder's
# logits within 0.017 of eager with reduce_range, 0.27 (cosine 0.985) without.
SATURATION_NOTE = ("quantize-dynamic wrote int8 weights for uint8 activations without reduce_range, and this "
                   "CPU has no VNNI: ONNX Runtime's int8 CPU kernels can saturate there (its quantization "
                   "guide); a parity failure on ort-cpu may be that, and {quantize-dynamic: {reduce_range: "
                   "true}} avoids it")


def quantize_dynamic(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as quantize

    reduce_range = bool(args.get("reduce_range", False))
    quantize(str(src), str(dst), weight_type=QuantType[args["weight_type"]], per_channel=args["per_channel"],
             reduce_range=reduce_range)
    vnni = cpu_has_vnni()
    facts: dict[str, Any] = {"cpu_vnni": vnni}
    if args["weight_type"] == "QInt8" and not reduce_range and vnni is False:
        facts["note"] = SATURATION_NOTE
    return facts


def quantize_static(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    """int8 QDQ, calibrated on the case's own inputs (its example, then its second shape)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    names = [i.name for i in onnx.load(str(src), load_external_data=False).graph.input]
    # by name where the file keeps the inputs' names, else in order
    batches = [{n: f[n] for n in names} if set(names) <= set(f) else dict(zip(names, f.values())) for f in feeds]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(batches)

        def get_next(self) -> dict | None:
            return next(self.left, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=args["per_channel"])
    return {"calibration_batches": len(batches)}


def ort_offline(src: Path, dst: Path, args: dict[str, Any], feeds: list[dict]) -> dict[str, Any]:
    """ONNX Runtime's offline optimisation: the graph optimised at a level, saved, loaded again."""
    from harness.runtimes.ort_session import SessionLoader

    config: tuple[tuple[str, str], ...] = ()
    if src.with_name(src.name + ".data").exists():
        # Else the saved file points at src's data file by a relative name (onnxruntime 1.32).
        config = (("session.optimized_model_external_initializers_file_name", dst.name + ".data"),)
    SessionLoader(src, level=args["level"], optimized_model=dst, config=config)()   # writes dst
    SessionLoader(dst, graph_optimizations=False)()   # the saved file loads
    return {}


BUILT_IN: dict[str, Callable[..., dict[str, Any]]] = {
    "onnxscript-optimizer": onnxscript_optimizer, "onnxslim": onnxslim_step, "onnxsim": onnxsim_step,
    "ort-fusion": ort_fusion, "fp16": fp16_occ, "fp16-ort": fp16_ort, "quantize-dynamic": quantize_dynamic,
    "quantize-static": quantize_static, "ort-offline": ort_offline,
}


def user_step(name: str, base_dir: Path) -> Callable[..., Any]:
    """A user's ``module:function`` or ``file.py:function`` (relative to the matrix file)."""
    target, _, function = name.rpartition(":")
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else base_dir / target
        spec = importlib.util.spec_from_file_location(f"harness_user_step_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise FileNotFoundError(f"step {name}: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, function)


def apply(step: dict[str, Any], src: Path, dst: Path, feeds: list[dict], base_dir: Path) -> dict[str, Any]:
    """Run one step: ``src`` → ``dst``; what the step reports (fusions, ...)."""
    name, args = step["step"], dict(step.get("args") or {})
    if name in BUILT_IN:
        return BUILT_IN[name](src, dst, args, feeds) or {}
    if is_user_step(name):
        out = user_step(name, base_dir)(str(src), str(dst), **args)
        return dict(out) if isinstance(out, dict) else {}
    raise ValueError(f"unknown step {name!r}")


def file_facts(path: Path) -> dict[str, Any]:
    """Nodes, op counts and bytes of a file (its data file included)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                  for n in model.graph.node)
    data = path.with_name(path.name + ".data")
    files = {path.name: path.stat().st_size, **({data.name: data.stat().st_size} if data.exists() else {})}
    return {"nodes": len(model.graph.node), "ops": dict(sorted(ops.items())), "bytes": sum(files.values()),
            "files": files}


def validate(path: Path) -> dict[str, Any]:
    """The ONNX checker and strict shape inference on a step's file: facts, not verdicts. A file
    either rejects may still load where it is deployed (ONNX Runtime sorts the nodes that
    ``OnnxModel.convert_float_to_float16`` leaves unsorted, which the checker rejects): the
    runtimes' verdict on it is the cell's."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
        checker = "ok"
    except Exception as exc:  # noqa: BLE001 - a fact of the file
        checker = short_error(exc)
    try:
        onnx.shape_inference.infer_shapes_path(str(path), str(path.with_name(path.name + ".inferred")),
                                               check_type=True, strict_mode=True)
        strict = "ok"
    except Exception as exc:  # noqa: BLE001 - a fact of the file; the runtimes still judge it
        strict = short_error(exc)
    finally:
        path.with_name(path.name + ".inferred").unlink(missing_ok=True)
    return {"checker": checker, "strict_shape_inference": strict}


def step_path(exported: Path, index: int, step: str) -> Path:
    """Where step ``index`` writes: beside the exported file, under its name (cleaned up with it)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in step)[:40]
    return exported.with_name(f"{exported.name}.{index}-{safe}.onnx")


def run_step(step: dict[str, Any], index: int, src: Path, exported: Path, feeds: list[dict],
             base_dir: Path, entry: dict[str, Any]) -> Path:
    """One step into ``entry`` (its facts, filled as it goes so a failure keeps what was known);
    returns the file it wrote. Raises what the step or the checker raised."""
    dst = step_path(exported, index, step["step"])
    entry["before"] = {k: v for k, v in file_facts(src).items() if k != "files"}
    t0 = time.perf_counter()
    try:
        entry.update(apply(step, src, dst, feeds, base_dir))
    finally:
        entry["seconds"] = round(time.perf_counter() - t0, 4)
    if not dst.exists():
        raise FileNotFoundError(f"step {step['step']} wrote no file at {dst.name}")
    entry["after"] = file_facts(dst)
    entry.update(validate(dst))
    return dst


REPRO = '''"""Step {step} of pipeline {pipeline} ({call}) on model.onnx, the file before it, with no
code of the matrix: the library call the cell made. python repro.py"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ONE_FILE_LIMIT = {limit}
ARGS = json.loads({args!r})

{source}

feeds = [dict(np.load(p)) for p in sorted(HERE.glob("inputs*.npz"))]   # the case's example, second shape
out = HERE / "after_step.onnx"
print({function}(HERE / "model.onnx", out, ARGS, feeds))
try:
    onnx.checker.check_model(str(out))
    print("step {step} wrote", out, "and the ONNX checker accepts it")
except Exception as exc:
    print("step {step} wrote", out, "and the ONNX checker rejects it:", exc)
'''


def repro_script(step: dict[str, Any], pipeline: str, base_dir: Path = Path(".")) -> str:
    """A ``repro.py`` that runs one step on the bundle's model.onnx: the step's own function here,
    copied with the helpers it calls (a user's step is imported as the matrix names it)."""
    import inspect
    import json

    name = step["step"]
    if name in BUILT_IN:
        fn = BUILT_IN[name]
        source = "\n\n".join(inspect.getsource(f) for f in (save, _load, fn))
        function, call = fn.__name__, STEPS[name].call
    else:
        target, _, attr = name.rpartition(":")
        if target.endswith(".py") and not Path(target).is_absolute():
            target = str((base_dir / target).resolve())
        load = (f"import importlib.util\nspec = importlib.util.spec_from_file_location('step', {target!r})\n"
                f"module = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)"
                if target.endswith(".py") else f"import importlib\nmodule = importlib.import_module({target!r})")
        source = (f"{load}\n\n\ndef user_step(src, dst, args, feeds):\n"
                  f"    return module.{attr}(str(src), str(dst), **args)")
        function, call = "user_step", name
    return REPRO.format(step=name, pipeline=pipeline, call=call, limit=ONE_FILE_LIMIT,
                        args=json.dumps(step.get("args") or {}), source=source, function=function)
