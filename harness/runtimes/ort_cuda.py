"""ONNX Runtime, CUDA execution provider.

ONNX Runtime silently falls back to the CPU provider when the CUDA provider cannot be created
(missing cuDNN, driver too old, ...). A CPU fall-back reported as a CUDA pass is the worst lie this
tool could tell, so the session's active providers are read back and anything but CUDA first is
refused. Latency is timed with IO binding: inputs live on the device and outputs are allocated
there, so a timed call measures the kernels plus one device synchronisation, not host copies.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Callable

import numpy as np

from harness.runtimes import gpu_unavailable_reason
from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable
from harness.runtimes.ort_session import SessionLoader

CUDA_EP = "CUDAExecutionProvider"


class ProviderFallbackError(RuntimeError):
    """The session was created, but not on the execution provider the cell is about."""


def check_providers(active: list[str], wanted: str = CUDA_EP) -> None:
    """Refuse a session whose first (highest-priority) active provider is not ``wanted``."""
    if not active or active[0] != wanted:
        raise ProviderFallbackError(
            f"ONNX Runtime did not activate {wanted} (active providers: {active}); refusing to "
            f"report a fall-back run as {wanted} (see the log for why the provider failed)")


def preload_cuda_libraries() -> None:
    """Load CUDA/cuDNN from the nvidia-* pip wheels (shared with torch) where ORT supports it."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)  # onnxruntime-gpu >= 1.21
    if preload is not None:
        preload()


class OrtCudaAdapter(RuntimeAdapter):
    name = "ort-cuda"
    provider = CUDA_EP
    package = "onnxruntime-gpu"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return f"package {cls.package} is not installed in this environment"
        if why := gpu_unavailable_reason():
            return why
        import onnxruntime as ort

        available = ort.get_available_providers()
        if cls.provider not in available:
            return (f"{cls.provider} is not in onnxruntime.get_available_providers() {available} "
                    f"(is the CPU-only onnxruntime installed instead of {cls.package}?)")
        return None

    @classmethod
    def version(cls) -> str | None:
        import onnxruntime

        return onnxruntime.__version__

    def provider_options(self) -> dict[str, Any]:
        return {"device_id": int(self.options.get("device_id", 0)), **self.options.get("provider_options", {})}

    def activate_impl(self) -> None:
        if self.precision != "fp32":
            raise RuntimeUnavailable(f"{self.name} runs the graph's own precision; {self.precision} "
                                     f"needs a {self.precision} ONNX file, which the exporters here do not write")
        preload_cuda_libraries()
        self.session = SessionLoader(self.model_path, ((self.provider, self.provider_options()), "CPUExecutionProvider"),
                                     self.threads)()
        active = self.session.get_providers()
        self.facts["providers"] = active
        check_providers(active, self.provider)
        self.facts["device_id"] = self.provider_options()["device_id"]

    def input_names_impl(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)

    def timed_call(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        import onnxruntime as ort

        device_id = self.provider_options()["device_id"]
        binding = self.session.io_binding()
        # Inputs are copied to the device once; every timed call reuses them.
        self._device_inputs = {n: ort.OrtValue.ortvalue_from_numpy(np.require(v, requirements="C"), "cuda", device_id)
                               for n, v in feeds.items()}
        for name, value in self._device_inputs.items():
            binding.bind_ortvalue_input(name, value)
        for out in self.session.get_outputs():
            binding.bind_output(out.name, "cuda", device_id)

        def call() -> None:
            binding.synchronize_inputs()
            self.session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return call

    def deactivate_impl(self) -> None:
        self._device_inputs = {}
        self.session = None
