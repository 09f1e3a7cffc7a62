"""ONNX Runtime with the OpenVINO execution provider (onnxruntime-openvino), CPU device.

ONNX Runtime hands the OpenVINO EP the parts of the graph it supports and runs the rest on its
CPU provider, silently. Two facts keep a verdict honest:

- **read-back**: the session's active providers are read back and anything but
  ``OpenVINOExecutionProvider`` first fails the cell at ``load`` (as ``ort-cuda`` does), so a
  CPU-provider session is never reported as an OpenVINO EP pass;
- **placement**: the first inference runs with ONNX Runtime's session profiling on; the profile's
  node events (``cat: Node``, ``args.provider``) give the nodes each provider ran, recorded as
  ``graph.runtime_facts.placement`` ({provider: nodes}; each OpenVINO subgraph is one fused node
  there), with each provider's share of the kernel time (``placement_time_share``). A file with
  more than half of its nodes on the fall-back provider (or no OpenVINO subgraph) gets a note. Profiling ends after that first
  call: the second shape and the latency run unprofiled.

``onnxruntime-openvino`` installs the ``onnxruntime`` module itself, so it cannot share an
environment with ``onnxruntime``: its own family.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable
from harness.runtimes.ort_cuda import check_providers
from harness.runtimes.ort_session import SessionLoader

OPENVINO_EP = "OpenVINOExecutionProvider"
CPU_EP = "CPUExecutionProvider"
PACKAGE = "onnxruntime-openvino"
PRECISIONS = {"fp32": "FP32", "fp16": "FP16"}


class OrtOpenVinoError(RuntimeError):
    """An ONNX Runtime / OpenVINO EP error, its message reduced to what the matrix should show."""


# "/onnxruntime/.../basic_backend.cc:136 onnxruntime::openvino_ep::BasicBackend::BasicBackend(...) "
# up to the EP's own "[OpenVINO-EP]" words; OpenVINO's "Exception from src/...:53:" lines.
_CPP_FRAMES = re.compile(r"/\S+\.(?:cc|cpp|h):\d+ .*?(?=\[OpenVINO-EP\])")
_LOCATION_LINE = re.compile(r"^(Exception from \S+:\d+:?|Check '.*' failed at \S+:\d+:?)$")


def summarise_error(text: str) -> str:
    """ONNX Runtime's first line without the C++ frames the EP prints, then OpenVINO's own
    message lines without their source locations."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return text.strip()
    head = re.sub(r"Exception from \S+:\d+:\s*", "", _CPP_FRAMES.sub("", lines[0]))
    head = re.sub(r"\s+", " ", head).strip()
    rest = [ln for ln in lines[1:] if not _LOCATION_LINE.match(ln)]
    return " ".join([head, *rest])


def call_readably(fn, *args: Any) -> Any:
    """``fn(*args)``; an ONNX Runtime error re-raised summary first, full text after (the log keeps
    it), outside the ``except`` block so the record's error is not the chained original."""
    try:
        return fn(*args)
    except Exception as exc:
        if isinstance(exc, (RuntimeUnavailable, MemoryError)):
            raise
        error = OrtOpenVinoError(f"{summarise_error(str(exc))}\n{exc}")
    raise error


def placement_from_profile(events: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, float]]:
    """Nodes per provider (distinct node names among the profile's node events) and each
    provider's share of the summed kernel time."""
    nodes: dict[str, set[str]] = defaultdict(set)
    time_us: dict[str, float] = defaultdict(float)
    for e in events:
        provider = (e.get("args") or {}).get("provider")
        if e.get("cat") != "Node" or not provider:
            continue
        name = str(e.get("name", ""))
        nodes[provider].add(name.removesuffix("_kernel_time"))
        if name.endswith("_kernel_time"):
            time_us[provider] += float(e.get("dur", 0))
    total = sum(time_us.values())
    share = {p: round(t / total, 4) for p, t in time_us.items()} if total > 0 else {}
    return {p: len(v) for p, v in sorted(nodes.items())}, share


class OrtOpenVinoAdapter(RuntimeAdapter):
    name = "ort-openvino"
    provider = OPENVINO_EP

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return f"package {PACKAGE} is not installed in this environment"
        import onnxruntime as ort

        available = ort.get_available_providers()
        if cls.provider not in available:
            return (f"{cls.provider} is not in onnxruntime.get_available_providers() {available} "
                    f"(is the plain onnxruntime installed instead of {PACKAGE}?)")
        return None

    @classmethod
    def version(cls) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(PACKAGE)
        except PackageNotFoundError:
            import onnxruntime

            return onnxruntime.__version__

    def provider_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"device_type": str(self.options.get("device_type", "CPU")),
                                "precision": PRECISIONS[self.precision]}
        if self.threads:
            opts["num_of_threads"] = int(self.threads)
        return {**opts, **self.options.get("provider_options", {})}

    def activate_impl(self) -> None:
        import onnxruntime as ort

        if self.precision not in PRECISIONS:
            raise RuntimeUnavailable(f"{self.name}: precision {self.precision} has no OpenVINO EP "
                                     f"precision option; expected one of {sorted(PRECISIONS)}")
        self._profile_dir = tempfile.mkdtemp(prefix="harness-ovep-profile-")
        self._profiling = True
        loader = SessionLoader(self.model_path, ((self.provider, self.provider_options()), CPU_EP), self.threads,
                               profile_prefix=str(Path(self._profile_dir) / "profile"))
        self.session = call_readably(loader)
        active = self.session.get_providers()
        self.facts.update({"providers": active, "provider_options": self.provider_options(),
                           "onnxruntime": ort.__version__})
        check_providers(active, self.provider)

    def input_names_impl(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = call_readably(self.session.run, None, feeds)
        if self._profiling:
            self._read_placement()
        return outputs

    def _read_placement(self) -> None:
        self._profiling = False
        path = self.session.end_profiling()
        try:
            events = json.loads(Path(path).read_text())
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        placement, share = placement_from_profile(events)
        self.facts["placement"] = placement
        self.facts["placement_time_share"] = share
        # Each OpenVINO subgraph is one profiled node; the CPU provider's nodes are the graph's
        # own. Their share of the file's nodes says how much of the graph fell back.
        import onnx

        total = len(onnx.load(str(self.model_path), load_external_data=False).graph.node)
        on_cpu = placement.get(CPU_EP, 0)
        self.facts["graph_nodes"] = total
        if placement.get(self.provider, 0) == 0 or (total and on_cpu / total > 0.5):
            self.facts["notes"] = [
                f"ort-openvino runs mostly on the fall-back {CPU_EP}: {on_cpu} of the file's {total} nodes "
                f"there ({share.get(CPU_EP, 0.0):.0%} of the kernel time), "
                f"{placement.get(self.provider, 0)} OpenVINO subgraph(s)"]

    def deactivate_impl(self) -> None:
        if getattr(self, "_profiling", False) and self.session is not None:
            with contextlib.suppress(Exception):
                os.unlink(self.session.end_profiling())
        self.session = None
        with contextlib.suppress(OSError):
            os.rmdir(self._profile_dir)
