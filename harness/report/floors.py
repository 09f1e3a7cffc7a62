"""The report's runtime releases per file: each passing cell's file tried on other releases of
its runtime in runtime-only environments (``graph.runtime_floor``, ``runtime_versions``,
``deploy``, written by harness.run.post.runtime_floors).

Drawn only from those facts, so a run without them renders as before: every function returns
nothing for it.
"""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from harness.core.record import Record
from harness.core.status import Status

PASS = Status.PASS.value   # as the records spell it

FACTS = ("runtime_floor", "runtime_versions", "deploy")


def _one_line(text: Any, limit: int = 200) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def floor_badge(rec: Record) -> str:
    """A cell's short mark: '≥1.18.1' per runtime floor, '✗1.16.3' when the deployed release fails."""
    graph = rec.graph or {}
    parts = []
    for runtime, floor in (graph.get("runtime_floor") or {}).items():
        if isinstance(floor, dict):
            parts.append(f"≥{floor['oldest_ok']}" if floor.get("oldest_ok") else "≥?")
    for runtime, dep in (graph.get("deploy") or {}).items():
        if isinstance(dep, dict) and dep.get("status") != PASS:
            parts.append(f"✗{dep.get('version')}")
    return " ".join(parts)


def floor_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per cell and runtime with releases tried on its file."""
    rows = []
    for rec in records:
        graph = rec.graph or {}
        if not any(graph.get(k) for k in FACTS):
            continue
        facts = graph.get("onnx_file") or {}
        opsets = ", ".join(f"{d} {v}" for d, v in (facts.get("opsets") or {}).items())
        runtimes = sorted({r for k in FACTS for r in (graph.get(k) or {})})
        for runtime in runtimes:
            floor = (graph.get("runtime_floor") or {}).get(runtime) or {}
            versions = (graph.get("runtime_versions") or {}).get(runtime) or {}
            dep = (graph.get("deploy") or {}).get(runtime) or {}
            rows.append({
                "cell": rec.cell_id, "runtime": runtime,
                "file": f"IR {facts.get('ir_version', '?')}; {opsets}" if facts else "",
                "oldest_ok": floor.get("oldest_ok") or ("none listed" if floor else ""),
                "first_bad": floor.get("first_bad") or "",
                "reason": floor.get("reason") or "",
                "versions": " ".join(f"{v} {'✓' if r.get('status') == PASS else '✗ ' + str(r.get('stage'))}"
                                     for v, r in versions.items()),
                "deploy": (f"{dep.get('version')} {'✓' if dep.get('status') == PASS else '✗ ' + str(dep.get('stage'))}"
                           if dep else ""),
            })
    return rows


def markdown_section(records: list[Record]) -> str:
    rows = floor_rows(records)
    if not rows:
        return ""
    table = tabulate([[r["cell"], r["runtime"], r["file"], r["oldest_ok"], r["first_bad"],
                       _one_line(r["reason"]), r["versions"], r["deploy"]] for r in rows],
                     headers=["cell", "runtime", "file", "oldest ok", "first bad", "why", "releases", "deploy"],
                     tablefmt="github")
    return ("## Runtime releases per file\n\nEach passing cell's exported file, loaded and run again "
            "in runtime-only environments (no export): the oldest listed release that loads it and "
            "matches eager, every release listed, the release deployed. In the matrix, `≥1.18.1` marks a "
            f"cell's runtime floor and `✗1.16.3` a deployed release that fails on its file.\n\n{table}\n\n")
