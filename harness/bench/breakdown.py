"""Where the default matrix's time goes (``nox -s bench -- --part default_matrix``).

- ``breakdown``: a finished run's time by part: environments and setup (the run's wall time less
  its two phases and the rendering), the verdict phase (and inside it, worker seconds: reference,
  export by exporter with each shared capture counted once, check, the runtime cells, blame), the
  latency phase (and its share), rendering (the run's reports made again, timed);
- ``bench_default_matrix``: matrix.yaml cold (environments installed, an empty cell cache) and
  warm (unchanged, every cell from the cache), each broken down, and capture reuse against the
  per-opset export measured side by side in one process per torch release
  (``python -m harness.worker.capture_proof``: each family exported both ways, alternately first);
- ``bench_zoo_sample``: a sample of the zoo nightly (``ZOO_SAMPLE``) cold and warm, broken down
  the same way.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.core.job import Job
from harness.core.record import Record, read_records
from harness.core.status import Stage
from harness.core.wire import CAPTURE_PROOF_MODULE
from harness.envs.provider import harness_process_env

DEFAULT_MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"
CELL_STAGES = (Stage.LOAD.value, Stage.RUN.value, Stage.PARITY.value)


def _group_key(r: Record) -> tuple:
    return (r.torch, r.case, r.exporter, r.opset, r.key.options.label)


def worker_seconds(records: list[Record]) -> dict[str, Any]:
    """Worker seconds of the verdict stages, each group's shared stages counted once and each
    shared capture once across the groups it served."""
    groups: dict[tuple, Record] = {}
    out: dict[str, Any] = {"reference_s": 0.0, "export_s": {}, "check_s": 0.0, "cells_s": 0.0, "blame_s": 0.0}
    for r in records:
        if r.cached_from:
            continue
        groups.setdefault(_group_key(r), r)
        out["cells_s"] += sum(r.duration_s.get(s, 0.0) for s in CELL_STAGES)
        out["blame_s"] += r.duration_s.get("blame", 0.0)
    for r in groups.values():
        made = r.export_made or {}
        capture = made.get("capture_s", 0.0) / max(made.get("shared_by", 1), 1)
        out["export_s"][r.exporter] = out["export_s"].get(r.exporter, 0.0) + r.duration_s.get("export", 0.0) + capture
        out["reference_s"] += r.duration_s.get("reference", 0.0)
        out["check_s"] += r.duration_s.get("check", 0.0)
    out["export_s"] = {k: round(v, 1) for k, v in sorted(out["export_s"].items())}
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in out.items()}


def render_seconds(run_dir: Path, reports: Path) -> float:
    """Seconds to make the run's reports again (``harness report RUN``)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "--reports", str(reports), "report", str(run_dir)],
                   check=True, capture_output=True, text=True)
    return round(time.perf_counter() - t0, 2)


def breakdown(run_dir: Path, reports: Path, wall_s: float, cpu_s: float | None = None) -> dict[str, Any]:
    records = read_records(run_dir / "results.jsonl")
    schedule = json.loads((run_dir / "run.json").read_text()).get("schedule", {})
    verdicts, latency = schedule.get("verdict_phase_s") or 0.0, schedule.get("latency_phase_s") or 0.0
    render = render_seconds(run_dir, reports)
    made: dict[str, int] = {}
    for r in records:
        if r.export_made and not r.cached_from:
            made[r.export_made.get("how", "?")] = made.get(r.export_made.get("how", "?"), 0) + 1
    return {
        "cells": len(records), "cached": sum(1 for r in records if r.cached_from), "wall_s": round(wall_s, 1),
        "cpu_s": cpu_s,
        "environments_and_setup_s": round(max(wall_s - verdicts - latency - render, 0.0), 1),
        "verdict_phase_s": verdicts, "latency_phase_s": latency,
        "latency_share": round(latency / wall_s, 3) if wall_s else None,
        "rendering_s": render, "worker_s": worker_seconds(records), "files_made": made,
    }


def proof_jobs(config: Path, folder: Path, ensure: bool = True,
               cases: list[str] | None = None) -> dict[str, tuple[Path, Path, int]]:
    """Per torch release of ``config``: its environment's interpreter (built when ``ensure`` and
    missing), a job of the matrix's dynamo groups (of ``cases`` only, when given), and how many
    groups it holds."""
    from harness.core.paths import envs_dir
    from harness.envs import make_provider
    from harness.matrix.config import load_matrix
    from harness.matrix.plan import build_plan

    only = {"exporter": ["dynamo"], "runtime": ["ort-cpu"], **({"case": list(cases)} if cases else {})}
    plan = build_plan(load_matrix(config), only)
    provider = make_provider("venv", log=lambda *a, **k: None)
    out = {}
    for env_plan in plan.environments:
        if ensure:
            provider.ensure(env_plan.env)
        groups = tuple(env_plan.groups())
        job = Job(run_id="proof", run_dir=str(folder / env_plan.env.name), env=env_plan.env.name,
                  groups=groups, base_dir=str(config.resolve().parent))
        path = job.write(folder / f"{env_plan.env.name}.json")
        out[env_plan.env.torch] = (envs_dir() / env_plan.env.name / "bin" / "python", path, len(groups))
    return out


def run_proof(python: Path, job: Path, out: Path, timeout: float = 3600) -> list[dict[str, Any]]:
    """``python -m harness.worker.capture_proof`` in one environment: its JSON lines."""
    proc = subprocess.run([str(python), "-m", CAPTURE_PROOF_MODULE, "--job", str(job), "--out", str(out)],
                          capture_output=True, text=True, env=harness_process_env(1), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{CAPTURE_PROOF_MODULE} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def reuse_ratio(config: Path) -> dict[str, Any]:
    """Capture reuse against the per-opset export, side by side in one process per release."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="harness-bench-reuse-") as tmp:
        for torch, (python, job, _) in proof_jobs(config, Path(tmp)).items():
            rows = run_proof(python, job, Path(tmp) / f"files-{torch}")
            costs = [r for r in rows if "family" in r]
            files = [r for r in rows if "gid" in r]
            per = sum(c["per_opset_cpu_s"] for c in costs)
            reused = sum(c["reused_cpu_s"] for c in costs)
            out[torch] = {"families": len(costs), "groups": len(files),
                          "same_files": sum(1 for r in files if r["same"]),
                          "translation_shared": sum(1 for r in files if r.get("translation") == "shared"),
                          "per_opset_cpu_s": round(per, 1), "reused_cpu_s": round(reused, 1),
                          "per_opset_wall_s": round(sum(c["per_opset_wall_s"] for c in costs), 1),
                          "reused_wall_s": round(sum(c["reused_wall_s"] for c in costs), 1),
                          "cpu_ratio": round(reused / per, 3) if per else None}
    return out


def cold_and_warm(config: Path, only: str = "") -> dict[str, Any]:
    """A matrix (``only`` its cells that match) run cold (an empty cell cache, environments as
    they are) and warm (the same again), each broken down."""
    from harness.bench.runs import bench_matrix_run

    with tempfile.TemporaryDirectory(prefix="harness-bench-breakdown-") as tmp:
        store = Path(tmp) / "reports"
        result: dict[str, Any] = {}
        for label in ("cold", "warm"):
            t0 = time.perf_counter()
            stats, _ = bench_matrix_run(config, only, store)
            run_dir = Path(stats["run_dir"])
            result[label] = breakdown(run_dir, store, time.perf_counter() - t0, stats["cpu_s"])
    result["warm_vs_cold"] = round(result["warm"]["wall_s"] / result["cold"]["wall_s"], 3)
    return result


def bench_default_matrix(config: Path = DEFAULT_MATRIX) -> dict[str, Any]:
    """matrix.yaml cold (empty cell cache) and warm (the same again), each broken down; then
    capture reuse against per-opset exports side by side."""
    result = cold_and_warm(config)
    result["capture_reuse"] = reuse_ratio(config)
    return result


# Six Transformers architectures of the zoo nightly (an encoder, two decoders with a KV cache, an
# encoder-decoder, vision, speech) with its three exporters, on the torch release installed from
# local disk (the others are 3 GB downloads each), at opset 18, on both of its runtimes.
ZOO_MATRIX = Path(__file__).resolve().parents[1] / "matrices" / "zoo.yaml"
ZOO_SAMPLE = "torch=2.13.0,opset=18,case=hf-bert|hf-gpt2|hf-llama|hf-t5|hf-vit|hf-whisper"


def bench_zoo_sample(config: Path = ZOO_MATRIX, only: str = ZOO_SAMPLE) -> dict[str, Any]:
    """The zoo sample (``ZOO_SAMPLE`` of the zoo nightly) cold and warm, each broken down."""
    return {"only": only, **cold_and_warm(config, only)}


def zoo_rows(result: dict[str, Any]) -> list[list[Any]]:
    return _phase_rows("zoo sample", result) + [["zoo sample: cells", result["only"]]]


def _phase_rows(name: str, result: dict[str, Any]) -> list[list[Any]]:
    out = []
    for label in ("cold", "warm"):
        for k, v in result[label].items():
            out.append([f"{name} {label}: {k}", v])
    out.append([f"{name}: warm / cold (wall)", result["warm_vs_cold"]])
    return out


def rows(result: dict[str, Any]) -> list[list[Any]]:
    out = _phase_rows("default matrix", result)
    for torch, v in result["capture_reuse"].items():
        out.append([f"capture reuse, torch {torch}: reused / per-opset export CPU", v["cpu_ratio"]])
        out.append([f"capture reuse, torch {torch}", {k: x for k, x in v.items() if k != "cpu_ratio"}])
    return out
