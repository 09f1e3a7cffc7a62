"""OpenVINO, CPU plugin.

The CPU plugin picks bf16 (or fp16) kernels by itself on CPUs that have them, which would make an
"fp32" cell quietly compare reduced-precision results against eager; the precision hint is
therefore always set explicitly and the precision the compiled model reports is what is recorded.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any, Callable

import numpy as np

from harness.runtimes.base import RuntimeAdapter

# matrix precision -> OpenVINO INFERENCE_PRECISION_HINT value
PRECISION_HINTS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}
# what get_property("INFERENCE_PRECISION_HINT") reports -> matrix precision
_REPORTED = {"f32": "fp32", "float32": "fp32", "f16": "fp16", "float16": "fp16", "bf16": "bf16"}


def compile_config(precision: str, threads: int | None) -> dict[str, Any]:
    """The CPU plugin properties for one cell (pure: unit-tested without compiling anything)."""
    if precision not in PRECISION_HINTS:
        raise ValueError(f"precision {precision!r} has no OpenVINO hint; expected one of {sorted(PRECISION_HINTS)}")
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY",
                              "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


class OpenVinoError(RuntimeError):
    """An OpenVINO exception, its message reduced to what the matrix should show."""


# OpenVINO prefixes every message with the C++ source locations it passed through; the first line
# (which is what a record keeps) would otherwise always read "Exception from .../core.cpp:84:".
_LOCATION_LINE = re.compile(r"^(Exception from \S+:\d+:?|Check '.*' failed at \S+:\d+:?)$")


def summarise_error(text: str) -> str:
    """The first informative line of an OpenVINO message, plus its 'Summary:' block if any."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not _LOCATION_LINE.match(ln)]
    if not lines:
        return text.strip()
    head = lines[0].rstrip(":")
    summary = [ln.lstrip("- ").strip() for ln in lines[lines.index("Summary:") + 1:]] if "Summary:" in lines else []
    return f"{head}: {'; '.join(summary)}" if summary else head


def call_readably(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, OpenVINO errors re-raised summary first, full text after (the log keeps it).

    Raised after the ``except`` block on purpose: a chained original would be appended to the
    record's error as its root cause, bringing the source-location line back.
    """
    try:
        return fn(*args)
    except RuntimeError as exc:
        error = OpenVinoError(f"{summarise_error(str(exc))}\n{exc}")
    raise error


def reported_precision(value: Any) -> str:
    """Normalise an ov.Type / string precision to the matrix's names (unknown ones kept as is)."""
    name = getattr(value, "get_type_name", lambda: str(value))()
    return _REPORTED.get(str(name).lower(), str(name))


def _contiguous(value: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d inputs 0-d (np.ascontiguousarray makes them 1-d)."""
    return np.require(value, requirements="C")


class OpenVinoAdapter(RuntimeAdapter):
    name = "openvino"
    device = "CPU"
    load_options = frozenset({"compiled_cache"})

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("openvino") is None:
            return "package openvino is not installed in this environment"
        return None

    @classmethod
    def version(cls) -> str | None:
        import openvino

        # '2026.4.1-22982-e213a147257-releases/2026/4' -> the release, as pip knows it
        return openvino.get_version().split("-")[0]

    def activate_impl(self) -> None:
        import openvino as ov

        core = ov.Core()
        config = compile_config(self.precision, self.threads)
        if self.load.compiled_cache is not None:
            # Compiled once, then imported: a process that finds the file's compiled model in
            # the cache (keyed by the file's bytes, the properties and OpenVINO's release) loads
            # it without reading the ONNX file or compiling (about 0.03 s against 0.13 to 0.2 s).
            core.set_property({"CACHE_DIR": str(self.load.compiled_cache)})
            self.compiled = call_readably(core.compile_model, str(self.model_path), self.device, config)
        else:
            model = call_readably(core.read_model, str(self.model_path))
            self.compiled = call_readably(core.compile_model, model, self.device, config)
        self.request = self.compiled.create_infer_request()
        self._inputs = [p.get_any_name() for p in self.compiled.inputs]
        actual = reported_precision(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        self.facts.update({
            "precision_requested": self.precision, "precision": actual, "device": self.device,
            "threads": self.compiled.get_property("INFERENCE_NUM_THREADS"),
            "performance_hint": str(self.compiled.get_property("PERFORMANCE_HINT")),
            "openvino": self.version(),
        })
        if self.load.compiled_cache is not None:
            self.facts["loaded_from_cache"] = bool(self.compiled.get_property("LOADED_FROM_CACHE"))

    def input_names_impl(self) -> list[str]:
        return list(self._inputs)

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # Feeds are keyed by graph input name; the model keeps its dynamic dims, so every call
        # may use a new shape. Each call gets a fresh request: a reused one keeps the previous
        # call's output tensors, and OpenVINO 2026.4 with PERFORMANCE_HINT=LATENCY runs a
        # shape-baked file at a new shape without raising and leaves them there (the previous
        # shape's output came back as this one's). Outputs are copied out of its buffers.
        request = self.compiled.create_infer_request()
        call_readably(request.infer, {name: _contiguous(v) for name, v in feeds.items()})
        return [request.get_output_tensor(i).data.copy() for i in range(len(self.compiled.outputs))]

    def timed_call(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        import openvino as ov

        # As benchmark_app does: inputs are bound once (zero-copy), a timed call is one
        # synchronous inference whose outputs stay in the request's buffers.
        self._bound = {n: _contiguous(v) for n, v in feeds.items()}
        for name, value in self._bound.items():
            self.request.set_tensor(name, ov.Tensor(value, shared_memory=True))
        return lambda: self.request.infer(share_outputs=True)

    def deactivate_impl(self) -> None:
        self._bound = {}
        self.request = None
        self.compiled = None
