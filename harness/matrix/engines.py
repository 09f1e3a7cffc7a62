"""A sharded plan in the shapes the engines that run it read: ``plan --format json`` (everything,
including the durations the split used, readable back by ``--durations``), ``github`` (the
``strategy.matrix`` of a workflow: one ``include`` entry per shard with the runner it needs) and
``k8s`` (an Indexed Job whose completion index is the shard, a shared volume and a merge Job,
rendered from ``templates/k8s.yaml.j2``).

Pure functions of the shards: nothing here reads the store or runs anything.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Any

from harness.matrix.plan import Plan
from harness.matrix.shards import Costs, Shard, balance, digest, split_digest

HOSTED_RUNNER = "ubuntu-latest"
GPU_RUNNER = "self-hosted,gpu"


def costs_block(plan: Plan, costs: Costs) -> dict[str, Any]:
    """The durations a split used, as ``--durations FILE`` reads them back (only the plan's cells)."""
    ids = sorted(c.cell_id for c in plan.cells)
    return {"source": costs.source, "setup_s": costs.setup_s,
            "cells": {i: costs.cells[i] for i in ids if i in costs.cells}}


def runner_labels(text: str) -> str | list[str]:
    """'ubuntu-latest' → that label; 'self-hosted,gpu' → ['self-hosted', 'gpu'] (runs-on takes both)."""
    labels = [s.strip() for s in text.split(",") if s.strip()]
    return labels[0] if len(labels) == 1 else labels


def shard_runner(shard: Shard, cpu_label: str, gpu_label: str) -> tuple[str | list[str], bool]:
    """Where a shard runs and whether on a GPU machine: GPU shards on the GPU label when one is
    given; without one they run on the CPU label, where their GPU cells are skips (nothing of
    them is installed) and the matrix stays complete."""
    if shard.gpu and gpu_label.strip():
        return runner_labels(gpu_label), True
    return runner_labels(cpu_label), False


def plan_document(plan: Plan, shards: list[Shard], costs: Costs, args: list[str],
                  cpu_label: str = HOSTED_RUNNER, gpu_label: str = GPU_RUNNER) -> dict[str, Any]:
    """``plan --format json``: the plan, its shards with their cells, and the split's inputs."""
    entries = []
    for s in shards:
        runs_on, on_gpu = shard_runner(s, cpu_label, gpu_label)
        entries.append({"shard": s.label, "index": s.index, "count": s.count,
                        "environments": s.environments, "needs_gpu": s.gpu, "gpu": on_gpu,
                        "runs-on": runs_on,
                        "cells": len(s.cells), "estimated_s": s.estimated_s,
                        "cell_ids": [c.cell_id for c in s.cells]})
    return {"args": args, "cells": len(plan.cells), "plan_digest": digest(c.cell_id for c in plan.cells),
            "shard_count": len(shards), "split_digest": split_digest(shards),
            "balance": balance(shards), "durations": costs_block(plan, costs), "shards": entries}


def github_matrix(shards: list[Shard], cpu_label: str = HOSTED_RUNNER,
                  gpu_label: str = GPU_RUNNER) -> dict[str, Any]:
    """``plan --format github``: the value of ``strategy.matrix`` (``fromJSON`` of it)."""
    include = []
    for s in shards:
        runs_on, on_gpu = shard_runner(s, cpu_label, gpu_label)
        envs = " ".join(s.environments)
        include.append({"shard": s.label, "name": f"{s.label} {envs}", "environments": envs,
                        "cells": len(s.cells), "estimated_s": round(s.estimated_s),
                        "gpu": on_gpu, "provider": "docker" if on_gpu else "venv",
                        "runs-on": runs_on, "cache-key": re.sub(r"[^A-Za-z0-9._-]+", "_", envs)})
    return {"include": include}


def render_k8s(document: dict[str, Any], image: str, pvc: str, storage: str = "200Gi",
               gpu_resource: str | None = None, name: str = "torch-onnx-matrix") -> str:
    """Kubernetes manifests for a planned split: a shared volume for the shard runs, the plan (its
    durations) as a ConfigMap, an Indexed Job whose completion index is the shard (two when GPU
    shards request ``gpu_resource``: CPU shards first, then GPU ones) and a merge Job that
    waits for every shard on the volume, merges them and writes the site."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    count = document["shard_count"]
    gpu_indexes = [s["index"] for s in document["shards"] if s["needs_gpu"]] if gpu_resource else []
    cpu_count = count - len(gpu_indexes)
    if gpu_indexes != list(range(cpu_count + 1, count + 1)):
        raise ValueError("GPU shards must come last in the split")
    jobs = [{"suffix": "", "offset": 1, "completions": cpu_count, "gpu": False}] if cpu_count else []
    if gpu_indexes:
        jobs.append({"suffix": "-gpu" if cpu_count else "", "offset": cpu_count + 1,
                     "completions": len(gpu_indexes), "gpu": True})
    root = f"/runs/{document['split_digest']}"
    env = Environment(loader=PackageLoader("harness.matrix", "templates"), undefined=StrictUndefined,
                      keep_trailing_newline=True)
    return env.get_template("k8s.yaml.j2").render(
        name=name, image=image, pvc=pvc, storage=storage, gpu_resource=gpu_resource, jobs=jobs,
        count=count, root=root, args=" ".join(shlex.quote(a) for a in document["args"]),
        shard_dirs=" ".join(f"{root}/shards/{k}" for k in range(1, count + 1)),
        plan_json=json.dumps(document, indent=1, sort_keys=True), document=document)
