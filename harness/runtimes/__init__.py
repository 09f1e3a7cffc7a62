"""Runtime registry: adding a runtime is adding a module and an entry here."""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    runner: str          # "module:Class", imported only inside a worker
    package: str         # pip distribution that provides it
    default_version: str
    family: str          # runtimes of one family share an environment
    extra_packages: tuple[str, ...] = ()
    needs_gpu: bool = False


RUNTIMES: dict[str, RuntimeInfo] = {
    "ort-cpu": RuntimeInfo("ort-cpu", "harness.runtimes.ort_cpu:OrtCpuRunner",
                           "onnxruntime", "1.32.0", family="cpu"),
}


def runtime_info(name: str) -> RuntimeInfo:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise KeyError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}") from None


def load_runner(name: str):
    module, cls = runtime_info(name).runner.split(":")
    return getattr(importlib.import_module(module), cls)
