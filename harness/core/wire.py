"""The wire between the runner and what runs inside an environment, defined once; both sides
import it, neither imports the other.

- the modules the runner starts as processes (``python -m MODULE``): the worker, the runtime-only
  programs, the reduction's driver, the blame's reference subprocess, the bench's timings;
- the environment variables a worker reads (set by the runner, or passed through from the user);
- the spool between the verdict phase and what comes after (the latency phase, the runtime
  releases, the interleaved timing): its folder and file names;
- the log relay's marker line and the notice a capped log carries;
- the answer of a runtime-only release check (``ReleaseCheck``), and the prefixes that mark an
  answer line in a stream a runtime or a case may also write to;
- the worker's events are the other half of the wire: ``harness.core.events``.

Standard library only: the worker imports it inside every environment. ``tests/test_architecture``
checks that no other module spells a harness module's path as a string.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from harness.core.status import Status

# -- processes the runner starts (``python -m``), each a module with a ``__main__`` -----------------
WORKER_MODULE = "harness.worker"                                   # a torch environment's worker
RELEASE_CHECK_MODULE = "harness.worker.runtime_only.release_check"  # one runtime release, no torch
AB_TIMER_MODULE = "harness.worker.runtime_only.ab_timer"            # interleaved A/B timing
REDUCE_MODULE = "harness.worker.diagnose.reduce"                    # the reduction's driver and check
ONNX_REFERENCE_MODULE = "harness.worker.diagnose.blame"             # blame's capped reference rung
BENCH_LATENCY_MODULE = "harness.worker.bench_latency"               # the bench's timings in an environment
CAPTURE_PROOF_MODULE = "harness.worker.capture_proof"               # capture reuse's files, both ways
CONTAINER_MODULE = "harness.envs.docker.container"                  # the runner's side of a container
# Run by its own interpreter as ``python -I -c <text>`` (it imports nothing of the harness): the
# file under harness/, and the prefix of its one answer line.
EXISTING_FACTS_FILE = "worker/existing_facts.py"
EXISTING_FACTS_PREFIX = "HARNESS-ENV-PROBE "

# -- environment variables a worker reads -----------------------------------------------------------
RUNNER_PID_ENV = "HARNESS_RUNNER_PID"      # die with the runner (Linux: PR_SET_PDEATHSIG)
TOKEN_ENV = "HARNESS_WORKER_TOKEN"         # marks every process of one worker, to find them all
# A verdict worker's scratch folder (its exports) in the temporary directory: named in its hello,
# removed by the runner when the worker was ended before it could remove it.
SCRATCH_PREFIX = "harness-export-"
RELAY_ENV = "HARNESS_LOG_RELAY"            # stdout/stderr are the runner's log relay (its nonce)
LOG_MAX_ENV = "HARNESS_LOG_MAX_BYTES"      # cap of each log (head and tail kept)
FORK_ENV = "HARNESS_WORKER_FORK"           # "0": every group in the worker itself, every reduction check and pass a fresh interpreter (the bench)
CAPTURE_REUSE_ENV = "HARNESS_CAPTURE_REUSE"  # "0": every opset captures on its own (proof, bench)
REFERENCE_CAP_ENV = "HARNESS_BLAME_REFERENCE_S"   # seconds the blame's reference rung may take

# -- the spool: <run_dir>/spool/<gid>/ holds a group's exported file between phases -------------------
SPOOL_DIR = "spool"
SPOOL_META = "spool.json"          # {"onnx", "inputs", "shapes", "torch", ["outputs", "atol", "rtol", "floors"]}
SPOOL_FEEDS = "feeds.npz"          # the example-shape feeds, in ``inputs`` order
SPOOL_EXPECTED = "expected.npz"    # eager's outputs (kept for the runtime-only environments)
# <run_dir>/spool/identity.onnx: the binding overhead's identity model, written by the verdict phase
# (which has onnx imported) for the latency workers (which would import onnx only to write it)
SPOOL_IDENTITY = "identity.onnx"

# -- answers in a shared stream ----------------------------------------------------------------------
AB_PREFIX = "AB "                  # each line the A/B timer answers with


def log_marker(nonce: str, gid: str) -> bytes:
    """The line that tells the runner's log relay where the following output belongs (a group's
    log; '' for the worker log). The nonce keeps a case's own output from passing for one."""
    return b"\x00harness-log " + nonce.encode() + b" " + gid.encode() + b"\n"


def cut_notice(cut: int, max_bytes: int) -> bytes:
    """What replaces the middle of a log that grew past its cap: written by the runner's relay and
    by the worker's in-place cap, which reads an earlier one back (``CUT_NOTICE_START``)."""
    return (f"\n[... {cut} bytes cut ({cut / 2**20:.1f} MiB): this log keeps its first and last "
            f"{max_bytes / 2 / 2**20:g} MiB (log_max_mb) ...]\n").encode()


CHECK_PASS, CHECK_FAIL = Status.PASS.value, Status.FAIL.value   # a ReleaseCheck's status
CUT_NOTICE_START = rb"\n\[\.\.\. (\d+) bytes cut "   # a regular expression: the count cut


@dataclass
class ReleaseCheck:
    """What one runtime release made of one file (a runtime-only environment's answer, and what
    a record keeps per release in ``graph.runtime_versions``)."""

    status: str                 # Status.PASS or Status.FAIL, as the records spell them
    stage: str | None = None    # load / run / parity, when it failed
    error: str | None = None    # the runtime's own message
    version: str | None = None  # the runtime's version as it reports it
    max_abs: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReleaseCheck":
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reduction:
    """The outcome of one cell's reduction: what goes into ``record.graph["reduced"]``."""

    original_nodes: int | None = None
    nodes: int | None = None
    ops: dict[str, int] = field(default_factory=dict)
    file: str | None = None            # reduced.onnx in the bundle (None: not reduced)
    inputs_file: str | None = None
    check: str | None = None           # what the reduced graph does on the cell's runtime
    note: str | None = None            # why there is no (smaller) reduced graph
    seconds: float | None = None
    timeout_s: float | None = None
    # The reduction could not be made (no bundle, no environment, Polygraphy missing, the driver
    # broke or ran out of time): a pass that did not run (harness.core.passes), not a finding
    # such as "the failure does not reproduce on the file alone".
    failed: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}
