"""Runtimes: one adapter module per runtime behind ``base.RuntimeAdapter`` (prepare / activate /
infer / deactivate, availability with a reason), and this registry of ``RuntimeInfo`` (package,
default version, environment family). Adding a runtime is adding a module and an entry here.

Takes an exported file and numpy feeds inside a worker; gives outputs, timed calls and facts
(providers, precision actually used). Vendor libraries are imported lazily.
"""
from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    adapter: str         # "module:Class", imported only inside a worker
    package: str         # pip distribution that provides it
    default_version: str
    family: str          # runtimes of one family share an environment
    extra_packages: tuple[str, ...] = ()
    needs_gpu: bool = False
    registry: str = "pypi"  # "npm": the package is an npm one, installed by the adapter
    module: str = ""        # the module it imports: an existing environment lacking it skips it


RUNTIMES: dict[str, RuntimeInfo] = {
    "ort-cpu": RuntimeInfo("ort-cpu", "harness.runtimes.ort_cpu:OrtCpuAdapter",
                           "onnxruntime", "1.32.0", family="cpu", module="onnxruntime"),
    # OpenVINO's wheel bundles its CPU plugin and needs only numpy: it shares the CPU env.
    "openvino": RuntimeInfo("openvino", "harness.runtimes.openvino:OpenVinoAdapter",
                            "openvino", "2026.4.1", family="cpu", module="openvino"),
    # opencv-python-headless needs only numpy: it shares the CPU env (and its exported files).
    "opencv-dnn": RuntimeInfo("opencv-dnn", "harness.runtimes.opencv_dnn:OpenCvDnnAdapter",
                              "opencv-python-headless", "5.0.0.93", family="cpu", module="cv2"),
    # ONNX Runtime for JavaScript: npm packages (installed per environment from the lockfiles in
    # runtimes/node/locks), run by one Node.js process per worker. No pip package: the version
    # pins the npm package. They share an environment (and its exported files) of their own.
    "ort-node": RuntimeInfo("ort-node", "harness.runtimes.ort_node:OrtNodeAdapter",
                            "onnxruntime-node", "1.30.0", family="node", registry="npm"),
    "ort-web": RuntimeInfo("ort-web", "harness.runtimes.ort_web:OrtWebAdapter",
                           "onnxruntime-web", "1.30.0", family="node", registry="npm"),
    # onnxruntime-openvino installs the `onnxruntime` module itself: a family of its own.
    "ort-openvino": RuntimeInfo("ort-openvino", "harness.runtimes.ort_openvino:OrtOpenVinoAdapter",
                                "onnxruntime-openvino", "1.24.1", family="ort-openvino", module="onnxruntime"),
    # onnxruntime-gpu 1.31 and torch 2.13 (PyPI) are both CUDA 13 builds: the nvidia-* wheels that
    # torch installs are the CUDA/cuDNN libraries ORT preloads, so no extra CUDA packages here.
    # Its import name clashes with onnxruntime, hence a family of its own.
    "ort-cuda": RuntimeInfo("ort-cuda", "harness.runtimes.ort_cuda:OrtCudaAdapter",
                            "onnxruntime-gpu", "1.31.1", family="gpu", needs_gpu=True, module="onnxruntime"),
    # The tensorrt meta package pulls tensorrt-cu13 (libs + bindings), matching torch's CUDA 13.
    "tensorrt": RuntimeInfo("tensorrt", "harness.runtimes.tensorrt:TensorRTAdapter",
                            "tensorrt", "11.4.0.106", family="gpu", needs_gpu=True, module="tensorrt"),
}


def runtime_info(name: str) -> RuntimeInfo:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise KeyError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}") from None


def load_adapter(name: str):
    module, cls = runtime_info(name).adapter.split(":")
    return getattr(importlib.import_module(module), cls)


def gpu_unavailable_reason() -> str | None:
    """Why NVIDIA GPU runtimes cannot run here, as precisely as the machine tells; None if they can.

    Checked in the order a user would fix things: a GPU at all, its kernel driver, the device nodes
    a container must be given, and the user-space driver library every CUDA runtime loads.
    """
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        if Path("/proc/driver/nvidia").exists():
            return ("NVIDIA driver is loaded but no /dev/nvidia[0-9]* device node is visible "
                    "(container started without GPU access?)")
        if _nvidia_pci_device():
            return "NVIDIA GPU present but its kernel driver is not loaded (no /proc/driver/nvidia)"
        return "no NVIDIA GPU on this machine (no /dev/nvidia[0-9]* device, no NVIDIA driver)"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"NVIDIA device present but the driver library libcuda.so.1 cannot be loaded ({exc})"
    return None


def _nvidia_pci_device() -> bool:
    for vendor in Path("/sys/bus/pci/devices").glob("*/vendor"):
        try:
            if vendor.read_text().strip() == "0x10de":  # NVIDIA's PCI vendor id
                return True
        except OSError:
            continue
    return False
