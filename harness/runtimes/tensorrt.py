"""TensorRT, built from the ONNX file with the ONNX parser; buffers and streams from torch.cuda.

The pure parts (optimisation profile from the cell's shapes, builder flags from the precision,
parser error text) are plain functions of plain data so that they are tested without a GPU.
fp32 means fp32: TF32 (on by default for Ampere and newer) is cleared. TensorRT 11 removed the
weak-typing precision flags, so fp16/bf16 there is a skip with the reason, not a silent fp32 run.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from harness.runtimes import gpu_unavailable_reason
from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]   # input name -> (min, opt, max)


class TensorRTParseError(RuntimeError):
    """The ONNX parser rejected the file; the message carries the parser's own errors."""


class PrecisionUnsupported(RuntimeUnavailable):
    """The requested precision cannot be expressed with this TensorRT version's builder."""


def optimisation_profile(network_inputs: Sequence[tuple[str, Shape]],
                         case_shapes: Sequence[dict[str, Shape]]) -> Profile:
    """min/opt/max per dynamic input, covering every shape the cell runs (opt = example shape).

    ``network_inputs`` are (name, dims) with -1 for dynamic dims, in network order; each entry of
    ``case_shapes`` maps the case's input names to concrete shapes. Inputs are matched by name, or
    by position when the graph renamed them (as the worker matches feeds).
    """
    profile: Profile = {}
    for pos, (name, dims) in enumerate(network_inputs):
        if all(d >= 0 for d in dims):
            continue
        seen = [_shape_for(name, pos, len(network_inputs), s) for s in case_shapes]
        seen = [s for s in seen if s is not None]
        if not seen:
            raise ValueError(f"input {name!r} has dynamic dims {tuple(dims)} but no shape was given "
                             f"for it; known inputs: {[list(s) for s in case_shapes]}")
        for s in seen:
            if len(s) != len(dims) or any(d >= 0 and d != v for d, v in zip(dims, s)):
                raise ValueError(f"input {name!r}: shape {s} does not fit the graph's dims {tuple(dims)}")
        lo = tuple(min(s[i] for s in seen) for i in range(len(dims)))
        hi = tuple(max(s[i] for s in seen) for i in range(len(dims)))
        profile[name] = (lo, seen[0], hi)
    return profile


def _shape_for(name: str, pos: int, count: int, shapes: dict[str, Shape]) -> Shape | None:
    if name in shapes:
        return tuple(int(d) for d in shapes[name])
    if len(shapes) == count:
        return tuple(int(d) for d in list(shapes.values())[pos])
    return None


def builder_flags(precision: str, available: Iterable[str]) -> tuple[list[str], list[str]]:
    """(flags to set, flags to clear) on the builder config for ``precision``.

    ``available`` are the names in ``tensorrt.BuilderFlag`` of the installed version.
    """
    available = set(available)
    clear = ["TF32"] if "TF32" in available else []
    if precision == "fp32":
        return [], clear
    flag = {"fp16": "FP16", "bf16": "BF16"}.get(precision)
    if flag is None:
        raise ValueError(f"unknown precision {precision!r}")
    if flag not in available:
        raise PrecisionUnsupported(
            f"this TensorRT has no BuilderFlag.{flag} (TensorRT 11 removed weak typing); {precision} "
            f"needs a {precision} ONNX file (e.g. ModelOpt AutoCast), which this matrix does not produce")
    return [flag], clear


def format_parser_errors(errors: Iterable[Any]) -> str:
    """One line per parser error: description, node index/name/operator when the parser has them."""
    lines = []
    for err in errors:
        parts = [str(_call(err, "desc") or err)]
        node, node_name, op = _call(err, "node"), _call(err, "node_name"), _call(err, "node_operator")
        where = ", ".join(x for x in (f"node {node}" if node not in (None, -1) else "",
                                      f"name {node_name!r}" if node_name else "",
                                      f"op {op}" if op else "") if x)
        if where:
            parts.append(f"({where})")
        code = _call(err, "code")
        if code is not None:
            parts.append(f"[{getattr(code, 'name', code)}]")
        lines.append(" ".join(parts))
    return "; ".join(lines) if lines else "the parser reported failure without an error message"


def _call(obj: Any, attr: str) -> Any:
    value = getattr(obj, attr, None)
    return value() if callable(value) else value


class TensorRTAdapter(RuntimeAdapter):
    name = "tensorrt"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.case_shapes: list[dict[str, Shape]] = []

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("tensorrt") is None:
            return "package tensorrt is not installed in this environment"
        if why := gpu_unavailable_reason():
            return why
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} in this environment cannot use CUDA (CPU build?)"
        return None

    @classmethod
    def version(cls) -> str | None:
        import tensorrt

        return tensorrt.__version__

    def prepare(self, shapes: list[dict[str, Shape]]) -> None:
        """The shapes the cell will run (example first); the engine's profile must cover them."""
        self.case_shapes = [{n: tuple(s) for n, s in d.items()} for d in shapes]

    def activate_impl(self) -> None:
        import tensorrt as trt
        import torch

        set_flags, clear_flags = builder_flags(self.precision, trt.BuilderFlag.__members__)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network()  # explicit batch is the only mode since 10.0
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(self.model_path)):
            raise TensorRTParseError(format_parser_errors(parser.get_error(i) for i in range(parser.num_errors)))
        config = builder.create_builder_config()
        for flag in set_flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        for flag in clear_flags:
            config.clear_flag(getattr(trt.BuilderFlag, flag))
        inputs = [network.get_input(i) for i in range(network.num_inputs)]
        profile = optimisation_profile([(t.name, tuple(t.shape)) for t in inputs], self.case_shapes)
        if profile:
            trt_profile = builder.create_optimization_profile()
            for name, (lo, opt, hi) in profile.items():
                trt_profile.set_shape(name, lo, opt, hi)
            config.add_optimization_profile(trt_profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError("TensorRT could not build an engine for this network (see the log)")
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self.facts.update({"tensorrt": trt.__version__, "builder_flags_set": set_flags,
                           "builder_flags_cleared": clear_flags,
                           "profile": {n: [list(s) for s in v] for n, v in profile.items()},
                           "device": torch.cuda.get_device_name()})

    def input_names_impl(self) -> list[str]:
        return list(self._inputs)

    def _bind(self, feeds: dict[str, np.ndarray]) -> list[Any]:
        """Copy inputs to the device, set shapes and addresses; return the output tensors."""
        import torch

        self._device_inputs = []
        for name in self._inputs:
            dtype = _torch_dtype(self.engine.get_tensor_dtype(name))
            t = torch.from_numpy(np.require(feeds[name], requirements="C")).to("cuda", dtype).contiguous()
            self._device_inputs.append(t)
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        outputs = []
        for name in self._outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(f"output {name!r} has a data-dependent shape {shape}; not supported here")
            dtype = _torch_dtype(self.engine.get_tensor_dtype(name))
            # Filled, not empty: memory the engine did not write reads as NaN (floats) or 0, never
            # as a previous call's output left in the caching allocator.
            out = (torch.full(shape, float("nan"), dtype=dtype, device="cuda") if dtype.is_floating_point
                   else torch.zeros(shape, dtype=dtype, device="cuda"))
            self.context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        return outputs

    def _execute(self) -> None:
        import torch

        # Inputs were written on the default stream; make ours wait for them, then sync on ours.
        self.stream.wait_stream(torch.cuda.current_stream())
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 reported failure (see the log)")
        self.stream.synchronize()

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # A new shape gets a fresh execution context: no state of a previous shape's run.
        shapes = tuple((n, tuple(np.shape(v))) for n, v in sorted(feeds.items()))
        if shapes != getattr(self, "_context_shapes", shapes):
            self.context = self.engine.create_execution_context()
        self._context_shapes = shapes
        outputs = self._bind(feeds)
        self._execute()
        return [o.cpu().numpy() for o in outputs]

    def timed_call(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        self._bind(feeds)  # buffers stay bound: a timed call is one launch plus one sync
        return self._execute

    def deactivate_impl(self) -> None:
        self._device_inputs = []
        self.context = None
        self.engine = None


def _torch_dtype(trt_dtype: Any):
    import torch

    table = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16,
             "INT32": torch.int32, "INT64": torch.int64, "INT8": torch.int8, "UINT8": torch.uint8,
             "BOOL": torch.bool}
    name = getattr(trt_dtype, "name", str(trt_dtype).rsplit(".", 1)[-1])
    if name not in table:
        raise TypeError(f"TensorRT tensor type {name} has no torch equivalent here")
    return table[name]
