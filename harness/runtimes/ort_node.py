"""ONNX Runtime for Node.js (onnxruntime-node, its native CPU execution provider).

The worker drives one long-lived Node.js process (``node_host``); the model is loaded there from
the file's path and tensors cross as raw bytes. A timed call is one ``session.run`` with feeds
bound in Node, timed there with ``performance.now()``: the latency (and the binding overhead on the
identity model) is the JavaScript API's, without the pipe to the worker. The npm package's
version is the runtime's version (``{name: ort-node, version: "1.22.0"}``), installed from the
lockfile the project keeps.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from harness.runtimes import node_host
from harness.runtimes.base import RuntimeAdapter, RuntimeUnavailable


class SelfTimedCall:
    """A timed call whose runtime measures itself: calling it returns the seconds the runtime
    reports for one inference (the latency protocol uses that instead of its own clock)."""

    self_timed = True

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn = fn

    def __call__(self) -> float:
        return self._fn()


class OrtJsAdapter(RuntimeAdapter):
    """onnxruntime-node / onnxruntime-web through a Node.js host process."""

    name = "ort-node"
    backend = "node"
    npm_package = "onnxruntime-node"
    # The npm version this process last activated: the binding overhead's identity adapter (built without
    # options) and ``version()`` (a class method) then speak of the cell's package version.
    _last_version: str | None = None

    def __init__(self, model_path, threads=None, precision="fp32", options=None) -> None:
        super().__init__(model_path, threads, precision, options)
        from harness.runtimes import runtime_info

        self.npm_version = str(self.options.get("npm_version") or type(self)._last_version
                               or runtime_info(self.name).default_version)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return node_host.node_unavailable_reason()

    @classmethod
    def version(cls) -> str | None:
        from harness.runtimes import runtime_info

        return cls._last_version or runtime_info(cls.name).default_version

    def session_request(self) -> dict[str, Any]:
        return {"op": "load", "model": str(self.model_path.resolve()), "threads": self.threads or 0}

    def activate_impl(self) -> None:
        if self.precision != "fp32":
            raise RuntimeUnavailable(f"{self.name} runs the graph's own precision; precision "
                                     f"{self.precision} is not applied by this runtime")
        type(self)._last_version = self.npm_version     # the cell's version, even if it fails to install
        self._modules, install = node_host.ensure_packages(self.npm_package, self.npm_version)
        self._bound: tuple[list, list] | None = None
        self._restarts = 0
        try:
            self._open_session()
        except node_host.HostDied:
            self._restart()
        type(self)._last_version = self.host.info["ort"]
        self.facts.update({"node": self.host.info["node"], "node_from": self.host.node_source,
                           self.npm_package: self.host.info["ort"], "backend": self.backend,
                           "threads": self.threads, **install})

    def _open_session(self) -> None:
        self.host = node_host.host_for(self.backend, self._modules)
        reply, _ = self.host.request(self.session_request())
        self.sid, self._inputs = reply["sid"], list(reply["input_names"])
        if self._bound is not None:
            self.host.request({"op": "bind", "sid": self.sid, "feeds": self._bound[0]}, self._bound[1])

    def _request(self, header: dict[str, Any], payload: list[bytes] | None = None):
        """One request on this adapter's session. A host that died in between (the worker's
        supervisor reaps every child process a group leaves when the next one starts, or the
        process crashed) is started again and the session reopened, once; a second death in
        the same request is the runtime's failure."""
        for attempt in (0, 1):
            try:
                return self.host.request({**header, "sid": self.sid}, payload or [])
            except node_host.HostDied:
                if attempt:
                    raise
                self._restart()
        raise AssertionError("unreachable")

    def _restart(self) -> None:
        # The supervisor reaps a group's leftover processes when the next group starts, at a
        # moment of its own: a host it killed is started again once (a second death is real).
        self._restarts += 1
        self.facts["host_restarts"] = self._restarts
        self._open_session()

    def input_names_impl(self) -> list[str]:
        return list(self._inputs)

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        heads, parts = node_host.encode_feeds(feeds)
        reply, payload = self._request({"op": "run", "feeds": heads}, parts)
        return node_host.decode_outputs(reply["outputs"], payload)

    def timed_call(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        heads, parts = node_host.encode_feeds(feeds)
        self._request({"op": "bind", "feeds": heads}, parts)
        self._bound = (heads, parts)
        return SelfTimedCall(lambda: self._request({"op": "timed"})[0]["ms"] / 1e3)

    def deactivate_impl(self) -> None:
        host = getattr(self, "host", None)
        if host is not None and host.alive() and getattr(self, "sid", None) is not None:
            try:
                host.request({"op": "release", "sid": self.sid})
            except node_host.NodeRuntimeError:
                pass
        self.host = None


class OrtNodeAdapter(OrtJsAdapter):
    name = "ort-node"
