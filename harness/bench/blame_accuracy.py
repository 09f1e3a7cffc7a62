"""How often blame names the right party, repository and layer: a run's blames scored against a
hand-labelled set of failing cells (``tests/fixtures/blame_labels.jsonl``: one line per root cause,
with its layer, kind, party, repository, the experiments that decide it and its cells), and what
the layer experiments cost per failing cell.

``python -m harness.bench.blame_accuracy RUN_DIR [LABELS]`` prints the scores of a finished run;
``nox -s bench`` (part ``blame_accuracy``) runs the labelled cells' matrix and prints them.
A labelled cell the run does not hold, or holds passing, counts as wrong: the score is over the
labelled set, not over what happened to run.
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.core.record import MODEL_OWNER, Record, read_records

LABELS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "blame_labels.jsonl"
BLAME_MATRIX = Path(__file__).resolve().parents[1] / "matrices" / "blame_labels.yaml"


@dataclass(frozen=True)
class Label:
    cell_id: str
    root_cause: str
    layer: str
    kind: str
    party: str          # model-code, exporter, runtime
    repository: str     # "model owner" for the model's code


def load_labels(path: Path = LABELS) -> list[Label]:
    labels = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            labels += [Label(c, d["root_cause"], d["layer"], d["kind"], d["party"], d["repository"])
                       for c in d["cells"]]
    return labels


def party_of(rec: Record | None) -> str | None:
    """A blame's party in the labels' vocabulary (every runtime party is 'runtime')."""
    if rec is None or rec.blame is None:
        return None
    return "runtime" if rec.blame.party.startswith("runtime") else rec.blame.party


def repository_of(rec: Record | None) -> str | None:
    if rec is None or rec.blame is None:
        return None
    if rec.blame.repository is None and rec.blame.party == "model-code":
        return MODEL_OWNER
    return rec.blame.repository


def score(records: list[Record], labels: list[Label]) -> dict[str, Any]:
    """Party, repository, layer and kind right, over the labelled cells; the wrong ones listed."""
    by_id = {r.cell_id: r for r in records}
    right = {"party": 0, "repository": 0, "layer": 0, "kind": 0}
    wrong: list[dict[str, Any]] = []
    limitation_as_bug = 0
    for label in labels:
        rec = by_id.get(label.cell_id)
        rec = rec if rec is not None and rec.status.is_failure else None
        got = {"party": party_of(rec), "repository": repository_of(rec),
               "layer": rec.blame.layer if rec and rec.blame else None,
               "kind": rec.blame.kind if rec and rec.blame else None}
        want = {"party": label.party, "repository": label.repository, "layer": label.layer, "kind": label.kind}
        for k in right:
            right[k] += got[k] == want[k]
        if (label.kind == "documented limitation" and got["kind"] != "documented limitation"
                and got["repository"] not in (None, MODEL_OWNER)):   # an upstream report of a documented limitation
            limitation_as_bug += 1
        if got["party"] != want["party"] or got["repository"] != want["repository"]:
            wrong.append({"cell_id": label.cell_id, "root_cause": label.root_cause, "want": want, "got": got})
    n = len(labels)
    return {"cells": n, **{f"{k}_right": v for k, v in right.items()},
            **{f"{k}_accuracy": round(v / n, 3) if n else None for k, v in right.items()},
            "documented_limitations_sent_upstream_as_bug": limitation_as_bug, "wrong": wrong}


def layer_cost(records: list[Record], verdict_phase_s: float | None = None) -> dict[str, Any]:
    """The layer experiments' seconds per failing cell (an experiment runs once per export group
    and is shared by its cells) against the failing cells' verdict time and, given, the run's
    verdict phase (wall seconds; the experiments' seconds are wall seconds of one worker)."""
    failing = [r for r in records if r.status.is_failure and r.blame is not None and not r.cached_from]
    own = [sum(e.get("seconds") or 0.0 for e in r.blame.experiments if not e.get("shared")) for r in failing]
    layer = [r.duration_s.get("layer", 0.0) for r in failing]
    verdict = sum(sum(v for k, v in r.duration_s.items() if k not in ("latency", "blame", "layer"))
                  for r in failing)
    return {"failing_cells": len(failing),
            "experiments_s_total": round(sum(own), 2),
            "experiments_s_per_failing_cell": round(sum(own) / len(failing), 3) if failing else None,
            "layer_s_median": round(statistics.median(layer), 3) if layer else None,
            "layer_s_max": round(max(layer), 3) if layer else None,
            "layer_vs_failing_cells_verdict_time": round(sum(layer) / verdict, 3) if verdict else None,
            **({"layer_s_total": round(sum(layer), 2), "verdict_phase_s": verdict_phase_s,
                "layer_vs_verdict_phase": round(sum(layer) / verdict_phase_s, 3)} if verdict_phase_s else {})}


def rows(result: dict[str, Any], cost: dict[str, Any]) -> list[list[Any]]:
    out = [[f"blame: {k} right", f"{result[f'{k}_right']}/{result['cells']} ({result[f'{k}_accuracy']:.0%})"]
           for k in ("party", "repository", "layer", "kind") if result["cells"]]
    out.append(["blame: documented limitations sent upstream as a bug", result["documented_limitations_sent_upstream_as_bug"]])
    out += [[f"layer experiments: {k}", v] for k, v in cost.items()]
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m harness.bench.blame_accuracy RUN_DIR [LABELS]", file=sys.stderr)
        return 2
    records = read_records(Path(argv[0]) / "results.jsonl")
    labels = load_labels(Path(argv[1]) if len(argv) == 2 else LABELS)
    schedule = json.loads((Path(argv[0]) / "run.json").read_text()).get("schedule", {})
    result, cost = score(records, labels), layer_cost(records, schedule.get("verdict_phase_s"))
    print(tabulate(rows(result, cost), headers=["measure", "value"], tablefmt="github"))
    for w in result["wrong"]:
        print(f"  wrong: {w['cell_id']} ({w['root_cause']}): want {w['want']}, got {w['got']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
