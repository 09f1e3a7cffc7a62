"""ONNX Runtime, CPU execution provider."""
from __future__ import annotations

import importlib.util

import numpy as np

from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable
from harness.runtimes.ort_session import SessionLoader


class OrtCpuAdapter(RuntimeAdapter):
    name = "ort-cpu"
    providers = ["CPUExecutionProvider"]
    load_options = frozenset({"graph_optimizations", "optimized_model"})

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "package onnxruntime is not installed in this environment"
        return None

    @classmethod
    def version(cls) -> str | None:
        import onnxruntime

        return onnxruntime.__version__

    def loader(self) -> SessionLoader:
        """The session this adapter runs, as its ``LoadOptions`` ask."""
        return SessionLoader(self.model_path, tuple(self.providers), self.threads,
                             graph_optimizations=self.load.graph_optimizations,
                             optimized_model=self.load.optimized_model)

    def activate_impl(self) -> None:
        # What the file itself computes in (an fp16 pipeline's file; harness.worker.steps): then the
        # cell's precision is the graph's own, and the CPU provider runs it as it is.
        own = getattr(self, "file_precision", None)
        if self.precision != "fp32" and self.name == "ort-cpu" and own != self.precision:
            # The CPU provider computes in the graph's own types; claiming fp16/bf16 would be a lie.
            raise RuntimeUnavailable(f"ort-cpu runs the fp32 graph as is; precision {self.precision} "
                                     "is not applied by this runtime")
        self.session = self.loader()()
        self.facts["providers"] = self.session.get_providers()

    def input_names_impl(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)

    def deactivate_impl(self) -> None:
        self.session = None
