"""The bench's measurements asked of an environment: ``python -m harness.worker.bench_latency``
in that environment's interpreter, one JSON answer on its last line."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from harness.core.wire import BENCH_LATENCY_MODULE
from harness.envs.provider import harness_process_env


def env_json(python: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run([str(python), "-m", BENCH_LATENCY_MODULE, *args], capture_output=True,
                          text=True, env=harness_process_env(1), check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])
