"""The optional passes of a run, and the ones that could not be made.

Beyond its verdicts a run may be asked for: the runtime releases tried on each passing cell's file
(``runtime_versions``, ``runtime_floor``, ``deploy``: harness.run.post.runtime_floors), the reduction of failing
files (``reduce``: harness.worker.diagnose.reduce), the blame ladder (``blame``) and the failing cell's bundle
(``bundle``). A pass that could not be made is never silent: the cell's record says which and why
(``Record.passes_not_run``), and run.json lists every such pass with its reason and the cells it
left out (``RunMeta.passes_not_run``, gathered here by ``gather``), which the terminal summary and
the reports show. Standard library only: the worker records blame and bundle gaps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

PASSES = ("runtime_floor", "runtime_versions", "deploy", "reduce", "blame", "bundle")
RELEASE_PASSES = ("runtime_versions", "runtime_floor", "deploy")   # the matrix keys that ask for them
NOT_INSTALLED = "install"     # the stage of a runtime release that could not be installed
EXAMPLES = 5          # cell ids named per gap in run.json (the count covers them all)


@dataclass
class PassGap:
    """One optional pass left out of some cells for one reason."""

    name: str                 # one of PASSES
    reason: str
    cells: int = 0            # how many cells it left out
    examples: list[str] = field(default_factory=list)   # the first cell ids

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PassGap":
        return cls(str(data.get("pass", "?")), str(data.get("reason", "")), int(data.get("cells") or 0),
                   [str(x) for x in data.get("examples") or []])

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.name, "reason": self.reason, "cells": self.cells, "examples": self.examples}

    def line(self) -> str:
        """One line for a terminal or a report: '<pass> not made for N cell(s): <reason>'."""
        return f"{self.name} not made for {self.cells} cell(s): {self.reason}"


def gather(records: Iterable[Any], reductions: Mapping[str, Mapping[str, Any]] | None = None) -> list[PassGap]:
    """Every pass some record could not have, grouped by pass and reason (in ``PASSES`` order,
    then the most cells first); ``reductions``: cell id → outcome (reductions.jsonl), whose
    ``failed`` outcomes are reductions that could not be made."""
    groups: dict[tuple[str, str], PassGap] = {}

    def add(name: str, reason: str, cell_id: str) -> None:
        gap = groups.setdefault((name, reason), PassGap(name, reason))
        gap.cells += 1
        if len(gap.examples) < EXAMPLES:
            gap.examples.append(cell_id)

    for rec in records:
        for name, reason in sorted((getattr(rec, "passes_not_run", None) or {}).items()):
            add(name, reason, rec.cell_id)
    for cell_id, outcome in sorted((reductions or {}).items()):
        if outcome.get("failed"):
            add("reduce", str(outcome.get("note") or "no reason given"), cell_id)
    order = {name: i for i, name in enumerate(PASSES)}
    return sorted(groups.values(), key=lambda g: (order.get(g.name, len(order)), -g.cells, g.reason))


def runtime_name(label: str) -> str:
    """The runtime of a record's runtime label ('ort-cpu@1.20.1' → 'ort-cpu')."""
    return label.split("@", 1)[0]


def matrix_releases(matrix: Any) -> dict[str, dict[str, Any]]:
    """Runtime name → the releases a matrix (its ``runtime_versions``, ``runtime_floor`` and
    ``deploy`` keys) asks each passing file of that runtime to be tried on."""
    versions, floor, deploy = (getattr(matrix, k, None) or {} for k in RELEASE_PASSES)
    return {rt: asked_releases(versions, floor, deploy, rt) for rt in {*versions, *floor, *deploy}}


def asked_releases(versions: Mapping[str, Any], floor: Mapping[str, Any], deploy: Mapping[str, Any],
                   runtime: str) -> dict[str, Any]:
    """The runtime releases a matrix asks each passing file of ``runtime`` to be tried on, by the
    key that asks (only the keys that do): what a record's graph must hold for them."""
    asked = {"runtime_versions": list(versions.get(runtime) or []),
             "runtime_floor": list(floor.get(runtime) or []), "deploy": deploy.get(runtime)}
    return {k: v for k, v in asked.items() if v}


def releases_missing(graph: Mapping[str, Any], runtime: str, asked: Mapping[str, Any]) -> dict[str, str]:
    """What a record's graph lacks of the releases ``asked`` (``asked_releases``) for its file,
    pass → what: a release not tried, a floor searched over another list, another deployed
    release. Releases that were tried but could not be installed are the record's own
    ``passes_not_run``, not missing here."""
    out: dict[str, str] = {}
    have = (graph.get("runtime_versions") or {}).get(runtime) or {}
    lacking = [v for v in asked.get("runtime_versions", []) if not isinstance(have.get(v), dict)]
    if lacking:
        out["runtime_versions"] = f"not tried on {', '.join(lacking)}"
    if asked.get("runtime_floor"):
        floor = (graph.get("runtime_floor") or {}).get(runtime)
        listed = floor.get("listed") if isinstance(floor, dict) else None
        if not isinstance(listed, list) or sorted(map(str, listed)) != sorted(asked["runtime_floor"]):
            out["runtime_floor"] = f"no floor searched over {', '.join(asked['runtime_floor'])}"
    if asked.get("deploy"):
        dep = (graph.get("deploy") or {}).get(runtime)
        if not isinstance(dep, dict) or dep.get("version") != asked["deploy"]:
            out["deploy"] = f"not tried on the deployed release {asked['deploy']}"
    return out
