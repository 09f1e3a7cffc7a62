"""OpenCV DNN (opencv-python-headless), the OpenCV backend on the CPU target.

As a vision user runs a file: ``cv2.dnn.readNetFromONNX``, ``setInput(blob, name)`` per graph
input, ``forward`` of the graph's output names. What OpenCV's ONNX importer cannot read is a
``load`` failure carrying OpenCV's own message (the first line of a ``cv2.error`` is only the
C++ source location, so the message is reduced to its informative part first).

The graph's input and output names come from the ONNX file itself (``onnx``, already in every
environment): OpenCV names the network's layers after the node outputs, so the ONNX output names
are what ``forward`` takes, in the graph's order (``getUnconnectedOutLayersNames`` is in layer
order, which may differ, and is used only when the names are not layers).
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any, Callable

import numpy as np

from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable

PACKAGE = "opencv-python-headless"
# "OpenCV(5.0.0) /io/opencv/modules/dnn/src/onnx/onnx_importer.cpp:1114: error: (-2:Unspecified error) in function 'handleNode'"
_LOCATION = re.compile(r"OpenCV\([^)]*\)\s+\S+:\d+:\s+error:\s+")
_FUNCTION = re.compile(r"\s+in function '[^']*'")


class OpenCvError(RuntimeError):
    """A cv2.error, its message reduced to what the matrix should show."""


def summarise_error(text: str) -> str:
    """OpenCV's message without source locations: the detail lines ('> ...') first, then the
    error code, e.g. "Node [Shape@ai.onnx]:(onnx_node!/Shape) parse error: (-215:Assertion
    failed) !isDynamicShape in function 'parseShape'" becomes readable on one line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = _FUNCTION.sub("", _LOCATION.sub("", lines[0])).strip() if lines else text.strip()
    details = [_FUNCTION.sub("", _LOCATION.sub("", ln.lstrip("> "))).strip() for ln in lines[1:]]
    details = [d for d in details if d]
    if not details:
        return head
    if re.fullmatch(r"\(-2:Unspecified error\)", head):   # the code says nothing the details do not
        return " ".join(details)
    return f"{' '.join(details)} [{head}]"


def call_readably(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a cv2.error re-raised summary first and the full text after (the log keeps
    it). Raised outside the ``except`` block so the record's error is not the chained original."""
    import cv2

    try:
        return fn(*args)
    except cv2.error as exc:
        error = OpenCvError(f"{summarise_error(str(exc))}\n{exc}")
    raise error


def graph_io(path: str) -> tuple[list[str], list[str]]:
    """The ONNX graph's runtime inputs (initializers excluded) and outputs, by name."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    return ([i.name for i in graph.input if i.name not in initializers],
            [o.name for o in graph.output])


class OpenCvDnnAdapter(RuntimeAdapter):
    name = "opencv-dnn"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("cv2") is None:
            return f"package {PACKAGE} is not installed in this environment"
        return None

    @classmethod
    def version(cls) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(PACKAGE)      # e.g. 5.0.0.93, as pip knows it
        except PackageNotFoundError:
            import cv2

            return cv2.__version__

    def activate_impl(self) -> None:
        import cv2

        if self.precision != "fp32":
            raise RuntimeUnavailable(f"{self.name} runs the fp32 graph on the CPU target; precision "
                                     f"{self.precision} is not applied by this runtime")
        if self.threads:
            cv2.setNumThreads(int(self.threads))
        self._inputs, self._outputs = graph_io(str(self.model_path))
        self._load_net()
        layers = set(self.net.getLayerNames() or ())
        unconnected = list(self.net.getUnconnectedOutLayersNames() or ())
        if all(o in layers for o in self._outputs) or not unconnected:
            self._forward_names = list(self._outputs)
        else:
            # The importer renamed the output layers: forward the network's own outputs.
            self._forward_names = unconnected
        self.facts.update({"backend": "DNN_BACKEND_OPENCV", "target": "DNN_TARGET_CPU",
                           "opencv": cv2.__version__, "threads": cv2.getNumThreads(),
                           "outputs_forwarded": list(self._forward_names)})

    def _load_net(self) -> None:
        import cv2

        self.net = call_readably(cv2.dnn.readNetFromONNX, str(self.model_path))
        self.net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        self.net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)

    def input_names_impl(self) -> list[str]:
        return list(self._inputs)

    def _set_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        for name, value in feeds.items():
            call_readably(self.net.setInput, np.require(value, requirements="C"), name)

    def _forward(self) -> list[np.ndarray]:
        return list(call_readably(self.net.forward, self._forward_names))

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # A new shape gets a freshly read network: the net keeps the blobs and shapes it
        # allocated for the previous inputs, and no output may be a previous call's.
        shapes = tuple((n, tuple(np.shape(v))) for n, v in sorted(feeds.items()))
        if shapes != getattr(self, "_net_shapes", shapes):
            self._load_net()
        self._net_shapes = shapes
        self._set_inputs(feeds)
        return [np.array(o, copy=True) for o in self._forward()]

    def timed_call(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        # Inputs are set once; a timed call is one forward pass (the network keeps its inputs).
        self._set_inputs(feeds)
        return lambda: self.net.forward(self._forward_names)

    def deactivate_impl(self) -> None:
        self.net = None
