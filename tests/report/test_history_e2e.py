"""Three nights reproduced locally through the commands the nightly workflow runs: three real runs
of a tiny matrix (a probe and a case of its own, torch 2.13.0), the case broken before the second
run and mended before the third, each appended with `history append`, the site written by
`history publish` and its freshness checked by `history check`."""
from __future__ import annotations

import datetime as dt
import json
import re
import textwrap

import pytest
from helpers import run_harness

from harness.store.nights import read_nights

pytestmark = pytest.mark.e2e

CASE = '''
def tiny():
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    return model, (torch.randn(2, 8),)
'''
MATRIX = '''
torch: ["2.13.0"]
exporters: [torchscript]
opsets: [17]
runtimes: [ort-cpu]
cases: [conv_bn, "b.py:tiny"]
latency: {enabled: false}
install: {find_links: [/opt/wheels]}
'''


def _page_data(html: str) -> dict:
    return json.loads(re.search(r'<script id="history-data" type="application/json">(.*?)</script>', html, re.S).group(1))


def test_three_nights_with_a_changed_case_make_a_site_that_shows_when_it_flipped(tmp_path):
    repo, reports, nights, site = tmp_path / "repo", tmp_path / "reports", tmp_path / "nights", tmp_path / "site"
    repo.mkdir()
    (repo / "matrix.yaml").write_text(MATRIX)
    today = dt.datetime.now(dt.timezone.utc).date()
    names = [(today - dt.timedelta(days=2 - i)).isoformat() for i in range(3)]
    bodies = [CASE, CASE.replace("return model,", "raise RuntimeError('tiny broke')\n    return model,"), CASE]
    run_ids = []
    for name, body in zip(names, bodies):
        (repo / "b.py").write_text(textwrap.dedent(body))
        proc = run_harness("--reports", str(reports), "matrix", "--config", str(repo / "matrix.yaml"))
        run_dir = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("run directory"))
        out = run_harness("--reports", str(reports), "history", "append", "--run", run_dir, "--nights", str(nights),
                          "--night", name, "--outcome", "success", "--config", str(repo / "matrix.yaml")).stdout
        assert out.startswith("night: ") and f"{name}.json.gz" in out, out
        run_ids.append(read_nights(nights)[-1].run_id)
    assert len(set(run_ids)) == 3
    again = run_harness("--reports", str(reports), "history", "append", "--run", run_dir, "--nights", str(nights),
                        "--config", str(repo / "matrix.yaml"))
    assert again.stdout.startswith("already recorded"), again.stdout   # append-only, idempotent

    run_harness("history", "publish", "--nights", str(nights), "--site", str(site))
    index = (site / "index.html").read_text(encoding="utf-8")
    for name in names:
        assert f'href="nights/{name}.html"' in index
        night_page = (site / "nights" / f"{name}.html").read_text(encoding="utf-8")
        assert "Overview" in night_page
    assert "Last updated" in index and f"newest night {names[2]}" in index
    assert 'id="stale-banner" class="banner" hidden' in index     # current: no banner

    data = _page_data(index)
    tiny = next(c for c in data["cells"] if c["case"] == "tiny")
    conv = next(c for c in data["cells"] if c["case"] == "conv_bn")
    assert tiny["strip"] == "pfp" and conv["strip"] == "ppp"
    assert tiny["first_failed"] == names[1] and tiny["fixed"] == names[2]
    assert tiny["streaks"][1]["stage"] == "reference" and "tiny broke" in tiny["streaks"][1]["error"]
    assert "case files changed: b.py" in tiny["streaks"][1]["changed"]
    assert conv["first_failed"] is None and conv["since"] == names[0]
    # Changes since last night: the mended cell, fail → pass, with what changed beside it.
    since_last = index.split('id="since-last"')[1].split("</section>")[0]
    assert ">tiny<" in since_last and "case files changed: b.py" in since_last and "conv_bn" not in since_last

    assert run_harness("history", "check", "--nights", str(nights)).stdout.startswith("current: ")
    stale = run_harness("history", "check", "--nights", str(nights), "--max-age-hours", "0.0001", check=False)
    assert stale.returncode == 1 and stale.stdout.startswith("NOT CURRENT: "), stale.stdout
    empty = run_harness("history", "check", "--nights", str(tmp_path / "none"), check=False)
    assert empty.returncode == 1 and "no night recorded yet" in empty.stdout
