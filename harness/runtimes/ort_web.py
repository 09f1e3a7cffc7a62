"""ONNX Runtime Web (onnxruntime-web), its WebAssembly backend, run under Node.js.

The same host process as ``ort-node`` (``node_host``) with the web package: the model is handed
over as bytes, as a page hands over a fetched file, and runs on the ``wasm`` execution provider
with ``env.wasm.numThreads`` set to the cell's threads. The web build lags the native one in
operators and in the IR / opset it reads: that is what these cells show.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.runtimes import node_host
from harness.runtimes.base import RuntimeUnavailable
from harness.runtimes.ort_node import OrtJsAdapter

BROWSERS = {"chromium": Path("/usr/bin/chromium")}


class OrtWebAdapter(OrtJsAdapter):
    name = "ort-web"
    backend = "web"
    npm_package = "onnxruntime-web"
    _last_version = None

    def session_request(self) -> dict[str, Any]:
        return {**super().session_request(), "external": node_host.external_data_files(self.model_path)}

    def activate_impl(self) -> None:
        browser = self.options.get("browser")
        if browser:
            exe = BROWSERS.get(str(browser))
            if exe is None:
                raise RuntimeUnavailable(f"ort-web browser {browser!r} is not known; known: {sorted(BROWSERS)}")
            if not exe.exists():
                raise RuntimeUnavailable(f"ort-web in {browser}: {exe} is not installed")
            raise RuntimeUnavailable(f"ort-web in {browser}: browser runs are not implemented yet; "
                                     "the WebAssembly backend runs under Node.js without `browser`")
        super().activate_impl()
