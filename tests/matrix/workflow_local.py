"""Run a fan-out workflow (.github/workflows/nightly.yml) on this machine, job by job, step by step.

The plan job's `run:` steps print the shard matrix into $GITHUB_OUTPUT; its JSON is fed to a
loop that runs the shard job once per `include` entry (each in its own directory, as a runner
would), then the merge job. `run:` steps execute as written, with `${{ }}` expressions
evaluated from the job's context; `nox -s SESSION -- ARGS` becomes `python -m harness SESSION
--config CONFIG ARGS` (so a small matrix stands in for matrix.yaml), run in the product environment
(tests/helpers.py: the project's declared dependencies only) and `pip install` is a no-op;
`mkdocs` builds this checkout's documentation; `torch-onnx-matrix` is
this checkout's installed command;
artifact uploads and downloads are folder copies; checkout, setup-python, caches and Pages
steps do nothing. Only what the workflow uses is supported; anything else raises.

    python tests/matrix/workflow_local.py --config tests/matrices/shards.yaml --shards 2 --work /tmp/wf
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = ROOT / ".github" / "workflows" / "nightly.yml"
NOOP_ACTIONS = ("actions/checkout", "actions/setup-python", "actions/cache", "actions/cache/restore",
                "actions/cache/save", "actions/upload-pages-artifact", "actions/deploy-pages")

# Shell functions in front of every `run:` block: the tools a runner has, pointed at this checkout.
PRELUDE = r'''
nox() {
  [ "$1" = "-s" ] || { echo "nox shim: expected -s SESSION" >&2; return 2; }
  local session="$2"; shift 2
  [ "${1:-}" = "--" ] && shift
  "$HARNESS_TOOL_PY" -m harness --reports "$PWD/reports" "$session" --config "$HARNESS_CONFIG" "$@"
}
python() {
  if [ "${1:-}" = "-m" ] && [ "${2:-}" = "pip" ]; then return 0; fi
  if [ "${1:-}" = "-m" ] && [ "${2:-}" = "harness" ]; then
    shift 2
    # The history keeps the nightly's matrix: here, the test's matrix in matrix.yaml's place.
    if [ "${1:-}" = "history" ] && [ "${2:-}" = "append" ]; then set -- "$@" --config "$HARNESS_CONFIG"; fi
    "$HARNESS_TOOL_PY" -m harness --reports "$PWD/reports" "$@"; return
  fi
  "$HARNESS_PY" "$@"
}
torch-onnx-matrix() {
  "$HARNESS_TOOL_PY" -c 'import sys; from harness.cli import console_main; sys.exit(console_main())' "$@"
}
mkdocs() {
  "$HARNESS_PY" -m mkdocs "$@" --config-file "$HARNESS_ROOT/mkdocs.yml"
}
'''


def _product_python() -> Path:
    """The product environment's interpreter (tests/helpers.py), also when run as a script."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from helpers import product_python

    return product_python()


def evaluate(expr: str, ctx: dict[str, Any]) -> Any:
    """A `${{ }}` expression of the forms the workflow uses: a context path, a quoted literal,
    `a || b || 'c'` (the first truthy one), `fromJSON(x)`."""
    expr = expr.strip()
    if "||" in expr:
        for part in expr.split("||"):
            value = evaluate(part, ctx)
            if value:
                return value
        return value
    if m := re.fullmatch(r"fromJSON\((.+)\)", expr):
        return json.loads(evaluate(m.group(1), ctx))
    if m := re.fullmatch(r"'([^']*)'", expr):
        return m.group(1)
    if not re.fullmatch(r"[A-Za-z_][\w.-]*", expr):
        raise NotImplementedError(f"expression not supported here: {expr!r}")
    value: Any = ctx
    for key in expr.split("."):
        value = value.get(key, "") if isinstance(value, dict) else ""
    return value


def substitute(text: str, ctx: dict[str, Any]) -> str:
    def one(m: re.Match) -> str:
        value = evaluate(m.group(1), ctx)
        return json.dumps(value) if isinstance(value, (dict, list)) else str(value).lower() \
            if isinstance(value, bool) else str(value)
    return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))


def condition(expr: str | None, ctx: dict[str, Any]) -> bool:
    if expr is None:
        return True
    expr = re.sub(r"^\$\{\{(.*)\}\}$", r"\1", str(expr).strip()).strip()
    if m := re.fullmatch(r"([\w.-]+)\s*(==|!=)\s*'([^']*)'", expr):
        equal = str(evaluate(m.group(1), ctx)) == m.group(3)
        return equal if m.group(2) == "==" else not equal
    return bool(evaluate(expr, ctx))


def run_job(name: str, job: dict, ctx: dict[str, Any], workdir: Path, artifacts: Path,
            config: Path, log: list[str]) -> dict[str, str]:
    """Run one job's steps in ``workdir``; return its outputs."""
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = {**ctx, "steps": {}}
    env = {k: substitute(v, ctx) for k, v in {**ctx["workflow_env"], **job.get("env", {})}.items()}
    for step in job["steps"]:
        if not condition(step.get("if"), ctx):
            continue
        uses = step.get("uses", "").split("@")[0]
        if uses in NOOP_ACTIONS:
            continue
        with_ = {k: substitute(v, ctx) for k, v in step.get("with", {}).items()}
        if uses == "actions/upload-artifact":
            src, dst = workdir / with_["path"], artifacts / with_["name"]
            if dst.exists():
                raise RuntimeError(f"{name}: artifact {with_['name']!r} uploaded twice")
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                dst.mkdir(parents=True)
                shutil.copy2(src, dst / src.name)
        elif uses == "actions/download-artifact":
            target = workdir / with_.get("path", ".")
            if "name" in with_:
                shutil.copytree(artifacts / with_["name"], target, dirs_exist_ok=True)
            else:
                for art in sorted(artifacts.iterdir()):
                    if fnmatch(art.name, with_["pattern"]):
                        shutil.copytree(art, target / art.name)
        elif uses:
            raise NotImplementedError(f"{name}: action {uses} not emulated")
        else:
            outputs = workdir / f".outputs-{len(log)}"
            outputs.write_text("")
            step_env = {**os.environ, **env,
                        **{k: substitute(v, ctx) for k, v in step.get("env", {}).items()},
                        "GITHUB_OUTPUT": str(outputs), "GITHUB_STEP_SUMMARY": str(workdir / ".summary"),
                        "RUNNER_TEMP": str(workdir / ".tmp"), "HARNESS_PY": sys.executable,
                        "HARNESS_TOOL_PY": str(_product_python()),
                        "HARNESS_CONFIG": str(config), "PYTHONPATH": str(ROOT),
                        "HARNESS_ROOT": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
            (workdir / ".tmp").mkdir(exist_ok=True)
            script = PRELUDE + "set -eo pipefail\n" + substitute(step["run"], ctx)
            proc = subprocess.run(["bash", "-c", script], cwd=workdir, env=step_env,
                                  capture_output=True, text=True)
            log.append(f"[{name}] {step.get('name', step['run'].splitlines()[0])}: exit {proc.returncode}")
            if proc.returncode:
                raise RuntimeError(f"{name}: step failed ({proc.returncode}):\n{step['run']}\n"
                                   f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
            if "id" in step:
                ctx["steps"][step["id"]] = {"outputs": dict(
                    line.split("=", 1) for line in outputs.read_text().splitlines() if "=" in line)}
    return {k: substitute(v, ctx) for k, v in job.get("outputs", {}).items()}


def run_workflow(config: Path, shards: int, work: Path, workflow: Path = NIGHTLY) -> dict[str, Any]:
    """Run plan → every shard of its matrix → merge; return the matrix, the merge job's
    directory and the step log."""
    spec = yaml.safe_load(workflow.read_text())
    jobs = spec["jobs"]
    artifacts = work / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    ctx: dict[str, Any] = {"inputs": {"shards": str(shards)}, "vars": {}, "needs": {},
                           "github": {"run_id": "local", "server_url": "https://github.com",
                                      "repository": "local/torch-onnx-matrix"},
                           "runner": {"os": "Linux"}}
    ctx["workflow_env"] = spec.get("env", {})
    log: list[str] = []
    plan_out = run_job("plan", jobs["plan"], ctx, work / "plan", artifacts, config, log)
    ctx["needs"]["plan"] = {"outputs": plan_out}
    shard_job = jobs["shard"]
    matrix = evaluate(re.sub(r"^\$\{\{(.*)\}\}$", r"\1", shard_job["strategy"]["matrix"]), ctx)
    for index, entry in enumerate(matrix["include"]):
        run_job(f"shard {entry['shard']}", shard_job,
                {**ctx, "matrix": entry, "strategy": {"job-index": index}},
                work / f"shard-{index}", artifacts, config, log)
    ctx["needs"]["shard"] = {"outputs": {}}
    run_job("merge", jobs["merge"], ctx, work / "merge", artifacts, config, log)
    return {"matrix": matrix, "merge_dir": work / "merge", "log": log}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--work", type=Path, required=True, help="empty scratch folder")
    parser.add_argument("--workflow", type=Path, default=NIGHTLY)
    args = parser.parse_args()
    result = run_workflow(args.config.resolve(), args.shards, args.work.resolve(), args.workflow)
    print("\n".join(result["log"]))
    print(json.dumps(result["matrix"], indent=1))
    print(f"merged run: {next((result['merge_dir'] / 'reports' / 'runs').iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
