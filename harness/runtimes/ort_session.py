"""The loader of every ONNX Runtime session: the one place this project calls
``onnxruntime.InferenceSession`` (``tests/test_architecture.py`` checks it).

As in Polygraphy, a loader (here ``SessionLoader``, Polygraphy's ``SessionFromOnnx``) says how a
session is made and the runner is built from it: the ONNX Runtime adapters (``ort_cpu``,
``ort_cuda``, ``ort_openvino``) each make their loader from the file, their providers and the
adapter's ``LoadOptions``, so blame's "ORT optimisations off" rung, divergence and reduction get
their sessions through an adapter with a loader option, not a second code path.
onnxruntime is imported lazily.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ONNX Runtime's own log levels: 3 is errors only (its warnings are about its own internals).
LOG_ERRORS = 3
# The optimisation levels a loader can ask for by name (onnxruntime.GraphOptimizationLevel members).
LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@dataclass(frozen=True)
class SessionLoader:
    """How one ONNX Runtime session is made; calling it makes the session."""

    model: Path
    providers: tuple[Any, ...] = ("CPUExecutionProvider",)   # names, or (name, options) pairs
    threads: int | None = None
    graph_optimizations: bool = True   # False: ORT_DISABLE_ALL, the graph as the exporter wrote it
    optimized_model: Path | None = None   # ORT writes the graph it runs (after its optimisations) there
    profile_prefix: str | None = None     # session profiling on, its JSON files named from this
    level: str | None = None   # an explicit optimisation level (LEVELS), e.g. a pipeline's offline step
    config: tuple[tuple[str, str], ...] = ()   # session config entries (add_session_config_entry)

    def session_options(self) -> Any:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = LOG_ERRORS
        if self.threads:
            opts.intra_op_num_threads = int(self.threads)
            opts.inter_op_num_threads = 1
        if not self.graph_optimizations:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        elif self.level is not None:
            opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self.level])
        for key, value in self.config:
            opts.add_session_config_entry(key, value)
        if self.optimized_model is not None:
            opts.optimized_model_filepath = str(self.optimized_model)
        if self.profile_prefix is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = self.profile_prefix
        return opts

    def __call__(self) -> Any:
        import onnxruntime as ort

        return ort.InferenceSession(str(self.model), self.session_options(), providers=list(self.providers))
