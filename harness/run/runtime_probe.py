"""Worker side of a runtime-only environment: load a spooled file in one runtime release, run
it on the spooled feeds and compare with eager's spooled outputs.

Runs in an environment without torch (numpy, onnx, the runtime): it imports only the runtime's
adapter and ``parity``. Prints a JSON list of ``ProbeResult`` (one per ``--spool``, in order) on
its last line of stdout; one process per release tries every file of a run::

    python -m harness.run.runtime_probe --spool DIR [--spool DIR ...] --runtime ort-cpu
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.core.status import Status

PASS, FAIL = Status.PASS.value, Status.FAIL.value   # as the records spell them

SPOOL_META = "spool.json"      # as harness.run.stages writes them (stages imports torch lazily,
SPOOL_FEEDS = "feeds.npz"      # but its import chain is not needed here)
SPOOL_EXPECTED = "expected.npz"


@dataclass
class ProbeResult:
    """What one runtime release made of one file."""

    status: str                 # "pass" or "fail"
    stage: str | None = None    # load / run / parity, when it failed
    error: str | None = None    # the runtime's own message
    version: str | None = None  # the runtime's version as it reports it
    max_abs: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProbeResult":
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_CPP_FRAME = re.compile(r"/\S+\.(?:cc|cpp|h):\d+ [\w:~]+\([^()]*(?:\([^()]*\)[^()]*)*\)\s*")


def runtime_error(exc: BaseException, model: Path) -> str:
    """The runtime's own message on one line, without the spool's path or C++ frame names."""
    text = f"{type(exc).__name__}: {exc}".replace(str(model), model.name)
    return " ".join(_CPP_FRAME.sub("", text).split())[:600]


@dataclass
class SpooledFile:
    """A spool folder read back: the exported file, its example-shape feeds (input name → array)
    and every input shape its cells ran (TensorRT builds its profile from them)."""

    onnx: Path
    feeds: dict[str, Any]
    shapes: list[dict[str, tuple[int, ...]]]
    meta: dict[str, Any]


def read_spooled(spool: Path) -> SpooledFile:
    """The file and feeds of a spool folder (as ``harness.run.stages.spool_group`` writes it)."""
    import numpy as np

    meta = json.loads((spool / SPOOL_META).read_text())
    with np.load(spool / SPOOL_FEEDS) as data:
        feeds = {n: data[f"arr_{i}"] for i, n in enumerate(meta["inputs"])}
    shapes = [{n: tuple(d) for n, d in s.items()} for s in meta.get("shapes") or []]
    return SpooledFile(spool / meta["onnx"], feeds, shapes or [{n: tuple(v.shape) for n, v in feeds.items()}], meta)


def write_spool(folder: Path, onnx_name: str, feeds: dict[str, Any], shapes: list[dict[str, Any]] | None = None,
                **meta: Any) -> Path:
    """Write the feeds and ``spool.json`` beside an exported file already in ``folder``."""
    import numpy as np

    names = list(feeds)
    np.savez(folder / SPOOL_FEEDS, *[feeds[n] for n in names])
    shapes = shapes or [{n: list(np.shape(v)) for n, v in feeds.items()}]
    (folder / SPOOL_META).write_text(json.dumps({"onnx": onnx_name, "inputs": names, "shapes": shapes, **meta}))
    return folder


def match_feeds(feeds: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The feeds by the graph's input names (by position when the names differ)."""
    return {n: feeds[n] for n in names} if all(n in feeds for n in names) else dict(zip(names, feeds.values()))


def probe(spool: Path, runtime: str, threads: int = 1) -> ProbeResult:
    import numpy as np

    from harness.run.parity import compare_outputs
    from harness.runtimes import load_adapter

    spooled = read_spooled(spool)
    meta, feeds = spooled.meta, spooled.feeds
    with np.load(spool / SPOOL_EXPECTED) as data:
        expected = [data[f"arr_{i}"] for i in range(meta["outputs"])]
    adapter_cls = load_adapter(runtime)
    result = ProbeResult(FAIL, version=adapter_cls.version())
    stage = "load"
    try:
        adapter = adapter_cls(spooled.onnx, threads=threads)
        adapter.prepare([{n: tuple(v.shape) for n, v in feeds.items()}])
        adapter.activate()
        use = match_feeds(feeds, adapter.input_names())
        stage = "run"
        outputs = [np.asarray(o) for o in adapter.infer(use)]
        stage = "parity"
        # Judged as the cell was: atol / rtol and the model's own noise (spooled since it existed).
        stats = compare_outputs(expected, outputs, meta["atol"], meta["rtol"], "example shape", meta.get("floors"))
        result.status, result.max_abs = PASS, stats.get("max_abs")
        stage = None
    except Exception as exc:  # noqa: BLE001 - any failure of the runtime is this release's verdict
        result.error = runtime_error(exc, spool / meta["onnx"])
    result.stage = stage
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.run.runtime_probe")
    parser.add_argument("--spool", required=True, type=Path, action="append",
                        help="a spool folder; repeated: every file in one process, one after the other")
    parser.add_argument("--runtime", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    results = [probe(spool, args.runtime, args.threads).to_dict() for spool in args.spool]
    sys.stdout.flush()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
