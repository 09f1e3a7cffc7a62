"""A gate over stored fixture runs (no cell is run) gives exactly the reference reports, which
were written by the first release: stored runs gate the same across harness versions."""
from __future__ import annotations

from helpers import BOTH, TESTS, check_reference

from harness.cli import main


def test_gate_over_stored_runs_matches_reference(store, tmp_path, capsys):
    out = tmp_path / "gate"
    rc = main(["--reports", str(store), "gate", "--config", str(TESTS / "matrices" / "gate.yaml"),
               "--baseline", f"{BOTH}@2.13.0", "--candidate", f"{BOTH}@2.6.0", "--remeasure", "0",
               "--output", str(out)])
    assert rc == 1  # the fixture's bump has new failures and slower cells
    check_reference("gate.md", (out / "gate.md").read_text(encoding="utf-8"))
    check_reference("gate-junit.xml", (out / "junit.xml").read_text(encoding="utf-8"))
    assert "4 regressions" in capsys.readouterr().out
