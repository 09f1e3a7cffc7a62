"""A case is everything it loads: a real matrix whose case imports a helper module and reads a
config file. An unchanged re-run comes from the cell cache; an edit to the helper, to the config
or to a declared data file runs the cell again, with the new verdict, as ``--fresh`` would."""
from __future__ import annotations

import textwrap

import pytest
from helpers import run_harness

from harness.core.record import read_records
from harness.core.status import Status

pytestmark = pytest.mark.e2e

CASE = '''
import json, os, sys
sys.path.insert(0, os.path.dirname(__file__))

def tiny():
    import torch
    import helper                                   # a shared layer, imported by the case
    with open(os.path.join(os.path.dirname(__file__), "conf.json")) as fh:
        width = json.load(fh)["width"]             # a config file the case reads
    return helper.Block(width), (torch.randn(2, width),)
'''
HELPER = '''
import torch

class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x))
'''
MATRIX = '''
torch: ["2.13.0"]
exporters: [torchscript]
opsets: [17]
runtimes: [ort-cpu]
cases: [{target: "b.py:tiny", data_files: ["vocab/*.txt"]}]
latency: {enabled: false}
install: {find_links: [/opt/wheels]}
'''


def run(repo, reports):
    proc = run_harness("--reports", str(reports), "matrix", "--config", str(repo / "matrix.yaml"))
    run_dir = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("run directory"))
    (rec,) = read_records(f"{run_dir}/results.jsonl")
    return rec, proc.stdout + proc.stderr


def test_an_edit_to_anything_the_case_loaded_runs_it_again(tmp_path):
    repo, reports = tmp_path / "repo", tmp_path / "reports"
    (repo / "vocab").mkdir(parents=True)
    (repo / "b.py").write_text(textwrap.dedent(CASE))
    (repo / "helper.py").write_text(textwrap.dedent(HELPER))
    (repo / "conf.json").write_text('{"width": 8}')
    (repo / "vocab" / "a.txt").write_text("a b c\n")
    (repo / "matrix.yaml").write_text(MATRIX)

    first, _ = run(repo, reports)
    assert first.status is Status.PASS and first.cached_from is None
    assert {"b.py", "helper.py", "conf.json", "vocab/a.txt"} <= set(first.case_files), first.case_files
    assert not any("site-packages" in name for name in first.case_files)

    warm, _ = run(repo, reports)
    assert warm.status is Status.PASS and warm.cached_from == first.run_id

    # The helper now raises: the stored pass must not stand for the cell.
    (repo / "helper.py").write_text(textwrap.dedent(HELPER).replace(
        "return torch.relu(self.lin(x))", "raise RuntimeError('helper broke')"))
    broken, out = run(repo, reports)
    assert broken.cached_from is None, "a stale pass was served after helper.py changed"
    assert broken.status is Status.FAIL and broken.stage == "reference" and "helper broke" in broken.error
    assert "files their case loaded changed" in " ".join(out.split()) and "helper.py" in out, out

    (repo / "helper.py").write_text(textwrap.dedent(HELPER))
    fixed, _ = run(repo, reports)   # the index keeps the newest run per key: the failing one
    assert fixed.status is Status.PASS and fixed.cached_from is None

    (repo / "conf.json").write_text('{"width": 12}')                  # a file the case opened
    wider, _ = run(repo, reports)
    assert wider.status is Status.PASS and wider.cached_from is None

    (repo / "vocab" / "b.txt").write_text("new file matching the declared glob\n")
    more, _ = run(repo, reports)
    assert more.cached_from is None and "vocab/b.txt" in more.case_files
