"""Two ONNX files timed by hand, as the issue did: no harness code, plain onnxruntime.

    python direct_interleaved.py A.onnx B.onnx [PROCESSES]

Each of PROCESSES fresh interpreters (default 3) loads both files (one thread, as the matrix's
cells), warms both up, then alternates them in 6 rounds of 300 calls each and prints the median
call of each file. The parent prints one JSON line: per process the two medians, and the median
over processes of B's over A's.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import numpy as np, onnxruntime as ort
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1; opts.inter_op_num_threads = 1
sessions = [ort.InferenceSession(p, opts, providers=["CPUExecutionProvider"]) for p in sys.argv[1:3]]
feeds = [{i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in s.get_inputs()}
         for s in sessions]
for s, f in zip(sessions, feeds):
    for _ in range(300):
        s.run(None, f)
times = [[], []]
for _ in range(6):
    for k in (0, 1):
        for _ in range(300):
            t0 = time.perf_counter(); sessions[k].run(None, feeds[k]); times[k].append(time.perf_counter() - t0)
print(json.dumps([statistics.median(t) * 1e3 for t in times]))
"""


def main(argv: list[str]) -> int:
    a, b = argv[0], argv[1]
    processes = int(argv[2]) if len(argv) > 2 else 3
    medians = []
    for _ in range(processes):
        out = subprocess.run([sys.executable, "-c", CHILD, a, b], capture_output=True, text=True, check=True)
        medians.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(json.dumps({"processes": medians, "ratio": statistics.median(m[1] / m[0] for m in medians)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
