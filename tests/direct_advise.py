"""The fastest passing configuration per case and runtime, from results.jsonl alone.

No project code: json over the run's records. A configuration passes when its status is `pass`
or `xpass` and its file declares the opset the cell asked for (`opset_actual` equal to `opset`,
or not recorded); the fastest is the lowest `latency_ms.median`. Prints one JSON object:
{"case|runtime": {"median": ms, "cells": [cell ids at that median], "passing": n}}.

    python tests/direct_advise.py reports/latest/results.jsonl
"""
import json
import sys


def fastest(path):
    best = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            slot = best.setdefault(f"{rec['case']}|{rec['runtime']}", {"median": None, "cells": [], "passing": 0})
            if rec["status"] not in ("pass", "xpass"):
                continue
            if rec.get("opset_actual") is not None and rec["opset_actual"] != rec["opset"]:
                continue   # asked 13, got 18: not a configuration of the requested opset
            slot["passing"] += 1
            median = (rec.get("latency_ms") or {}).get("median")
            if median is None:
                continue
            if slot["median"] is None or median < slot["median"]:
                slot["median"], slot["cells"] = median, [rec["cell_id"]]
            elif median == slot["median"]:
                slot["cells"].append(rec["cell_id"])
    return best


if __name__ == "__main__":
    print(json.dumps(fastest(sys.argv[1]), sort_keys=True))
