"""Workflow hygiene: .github/workflows validate against GitHub's workflow schema and zizmor
(offline) finds nothing of medium or high severity or high confidence; actions are pinned by
commit with a version comment; the nightly fans out plan → shards → merge → Pages."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _tool(name: str) -> str:
    """The linter next to this interpreter (the `test` extra installs it), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is missing: install the project's test extra (pip install -e '.[test]')"
    return found


def _zizmor(path: Path) -> list[dict]:
    proc = subprocess.run([_tool("zizmor"), "--offline", "--format", "json", str(path)],
                          capture_output=True, text=True)
    assert proc.stdout.strip().startswith("["), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"nightly.yml", "gate.yml"}


def test_workflows_match_the_github_schema():
    proc = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                           *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_finds_nothing_serious():
    findings = [f for path in WORKFLOWS for f in _zizmor(path)]
    serious = [(f["ident"], f["determinations"], f["locations"][0]["concrete"]["location"]["start_point"])
               for f in findings if f["determinations"]["severity"] in ("Medium", "High")
               or f["determinations"]["confidence"] == "High"]
    assert not serious, serious


def test_zizmor_runs_offline_and_catches_what_it_should(tmp_path):
    """The linter itself works here: an unpinned action and an expression inlined into `run:`
    (what the workflows had) are high findings."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "name: bad\non: pull_request\npermissions: {}\njobs:\n  x:\n    runs-on: ubuntu-latest\n"
        "    steps:\n      - uses: actions/checkout@v4\n        with: {persist-credentials: false}\n"
        "      - run: echo \"${{ github.event.pull_request.title }}\"\n")
    idents = {f["ident"] for f in _zizmor(bad) if f["determinations"]["severity"] == "High"}
    assert {"unpinned-uses", "template-injection"} <= idents


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_pinned_by_commit_with_version_comment(path):
    uses = re.findall(r"uses:\s*(\S+)(.*)", path.read_text())
    assert uses
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), ref
        assert re.search(r"#\s*v\d+(\.\d+)*", rest), f"{ref}: no version comment"
    spec = yaml.safe_load(path.read_text())
    for job in spec["jobs"].values():
        for step in job.get("steps", []):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
            assert "${{" not in step.get("run", ""), f"expression inlined into run: {step['run'][:80]}"


def test_nightly_fans_out_plan_shards_merge_pages():
    spec = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    jobs = spec["jobs"]
    assert spec["permissions"] == {"contents": "read"}
    assert jobs["shard"]["needs"] == "plan"
    assert jobs["shard"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert jobs["shard"]["runs-on"] == "${{ matrix.runs-on }}"
    shard_runs = " ".join(s.get("run", "") for s in jobs["shard"]["steps"])
    assert "nox -s matrix -- --shard" in shard_runs and '--provider "$PROVIDER"' in shard_runs
    assert "nox -s images" in shard_runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in jobs["shard"]["steps"])
    assert any(s.get("uses", "").startswith("actions/cache@") and s["with"]["path"] == "~/.cache/uv"
               for s in jobs["shard"]["steps"])
    assert jobs["merge"]["needs"] == "shard"
    assert "python -m harness merge" in " ".join(s.get("run", "") for s in jobs["merge"]["steps"])
    merge_runs = " ".join(s.get("run", "") for s in jobs["merge"]["steps"])
    assert "python -m harness history append" in merge_runs and "python -m harness history publish" in merge_runs
    assert any(s.get("with", {}).get("ref") == "results" for s in jobs["merge"]["steps"])
    assert jobs["record"]["needs"] == "merge" and jobs["record"]["permissions"] == {"contents": "write"}
    assert "HEAD:results" in " ".join(s.get("run", "") for s in jobs["record"]["steps"])
    assert "python -m harness history check" in " ".join(s.get("run", "") for s in jobs["fresh"]["steps"])
    assert jobs["failed"]["if"] == "${{ failure() }}" and jobs["fresh"]["needs"] == ["record", "failed"]
    assert "history append --no-run --outcome failure" in " ".join(s.get("run", "") for s in jobs["failed"]["steps"])
    assert jobs["deploy"]["needs"] == "merge"
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    plan_run = " ".join(s.get("run", "") for s in jobs["plan"]["steps"])
    assert "--format github" in plan_run and '--gpu-runner-label "$GPU_RUNNER_LABEL"' in plan_run


def test_gate_fans_out_the_same_way():
    jobs = yaml.safe_load((ROOT / ".github" / "workflows" / "gate.yml").read_text())["jobs"]
    assert jobs["shard"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert jobs["gate"]["needs"] == ["plan", "shard"]
    gate_runs = " ".join(s.get("run", "") for s in jobs["gate"]["steps"])
    assert "python -m harness merge" in gate_runs and "nox -s gate" in gate_runs
    assert "--min-shard-cells" in " ".join(s.get("run", "") for s in jobs["plan"]["steps"])
