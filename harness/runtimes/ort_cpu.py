"""ONNX Runtime, CPU execution provider."""
from __future__ import annotations

import importlib.util

import numpy as np

from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable


class OrtCpuAdapter(RuntimeAdapter):
    name = "ort-cpu"
    providers = ["CPUExecutionProvider"]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "package onnxruntime is not installed in this environment"
        return None

    @classmethod
    def version(cls) -> str | None:
        import onnxruntime

        return onnxruntime.__version__

    def session_options(self):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        return opts

    def activate_impl(self) -> None:
        import onnxruntime as ort

        if self.precision != "fp32" and self.name == "ort-cpu":
            # The CPU provider computes in the graph's own types; claiming fp16/bf16 would be a lie.
            raise RuntimeUnavailable(f"ort-cpu runs the fp32 graph as is; precision {self.precision} "
                                     "is not applied by this runtime")
        self.session = ort.InferenceSession(
            str(self.model_path), self.session_options(), providers=self.providers
        )
        self.facts["providers"] = self.session.get_providers()

    def input_names_impl(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)

    def deactivate_impl(self) -> None:
        self.session = None
