"""A runtime-only environment's half of the runtime releases: load a spooled file in one runtime
release, run it on the spooled feeds and compare with eager's spooled outputs.

Runs in an environment without torch (numpy, onnx, the runtime): it imports only the runtime's
adapter, the spool reader and ``parity``. Prints a JSON list of ``ReleaseCheck`` (one per
``--spool``, in order) on its last line of stdout; one process per release tries every file of a
run (the runner's half: ``harness.run.post.runtime_floors``)::

    python -m harness.worker.runtime_only.release_check --spool DIR [--spool DIR ...] --runtime ort-cpu
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from harness.core.errors import whole_error
from harness.core.wire import CHECK_FAIL, CHECK_PASS, RELEASE_CHECK_MODULE, ReleaseCheck

_CPP_FRAME = re.compile(r"/\S+\.(?:cc|cpp|h):\d+ [\w:~]+\([^()]*(?:\([^()]*\)[^()]*)*\)\s*")


def runtime_error(exc: BaseException, model: Path) -> str:
    """The runtime's own message on one line, without the spool's path or C++ frame names."""
    return whole_error(exc, clean=lambda text: _CPP_FRAME.sub("", text.replace(str(model), model.name)))


def check_release(spool: Path, runtime: str, threads: int = 1) -> ReleaseCheck:
    """What the installed release of ``runtime`` makes of one spooled file."""
    import numpy as np

    from harness.runtimes import load_adapter
    from harness.runtimes.base import match_feeds
    from harness.worker.parity import compare_outputs
    from harness.worker.spool import read_spooled

    spooled = read_spooled(spool)
    meta, feeds = spooled.meta, spooled.feeds
    expected = spooled.expected()
    adapter_cls = load_adapter(runtime)
    result = ReleaseCheck(CHECK_FAIL, version=adapter_cls.version())
    stage = "load"
    try:
        adapter = adapter_cls(spooled.onnx, threads=threads)
        adapter.prepare([{n: tuple(v.shape) for n, v in feeds.items()}])
        with adapter:
            use = match_feeds(feeds, adapter.input_names())
            stage = "run"
            outputs = [np.asarray(o) for o in adapter.infer(use)]
        stage = "parity"
        # Judged as the cell was: atol / rtol and the model's own noise (spooled since it existed).
        stats = compare_outputs(expected, outputs, meta["atol"], meta["rtol"], "example shape", meta.get("floors"))
        result.status, result.max_abs = CHECK_PASS, stats.get("max_abs")
        stage = None
    except Exception as exc:  # noqa: BLE001 - any failure of the runtime is this release's verdict
        result.error = runtime_error(exc, spooled.onnx)
    result.stage = stage
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=RELEASE_CHECK_MODULE)
    parser.add_argument("--spool", required=True, type=Path, action="append",
                        help="a spool folder; repeated: every file in one process, one after the other")
    parser.add_argument("--runtime", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    results = [check_release(spool, args.runtime, args.threads).to_dict() for spool in args.spool]
    sys.stdout.flush()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
