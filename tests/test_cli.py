"""The command line: one module per subcommand, loaded only when asked for (`--help` imports
neither scipy, pandas nor pydantic), `python -m harness` and the installed command share one
parser; terminal output: the summary of a finished run, and which finished cells get a line."""
from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, product_python
from rich.console import Console

from harness.cli import COMMANDS, build_parser, command_module
from harness.cli.commands.matrix import summary

FIXTURE_RUN = ROOT / "tests" / "fixtures" / "runs" / "20261129-144014-ca9e5d"


def test_every_subcommand_is_a_module_with_help_arguments_and_run():
    modules = {p.stem for p in (ROOT / "harness" / "cli" / "commands").glob("*.py") if p.stem != "__init__"}
    assert modules == {m for m, _ in COMMANDS.values()}
    for name in COMMANDS:
        module = command_module(name)
        assert module.HELP == COMMANDS[name][1]
        assert callable(module.add_arguments) and callable(module.run)


@pytest.mark.parametrize("argv", [["--help"], ["matrix", "--help"], ["gate", "--help"], ["init", "--help"]])
def test_help_imports_only_what_it_needs(argv):
    code = ("import sys\nfrom harness.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "import json\nprint(json.dumps(sorted(m for m in ('scipy', 'pandas', 'matplotlib', 'pydantic', 'jinja2') "
            "if m in sys.modules)))")
    proc = subprocess.run([str(product_python()), "-c", code, *argv], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "scipy" not in loaded and "pandas" not in loaded and "matplotlib" not in loaded, loaded
    if argv == ["--help"]:
        assert loaded == [], loaded   # the top-level help loads no subcommand at all


def test_a_subcommand_parses_the_same_with_or_without_the_others():
    """The lazy parser (only the named subcommand gets its options) reads arguments exactly as
    the whole one does."""
    argv = ["--reports", "/tmp/r", "gate", "--baseline", "2.6.0", "--candidate", "2.13.0", "--block-on", "io",
            "--alpha", "0.01"]
    lazy = vars(build_parser(argv=argv).parse_args(argv))
    whole = vars(build_parser().parse_args(argv))
    lazy.pop("func"), whole.pop("func")
    assert lazy == whole
    assert lazy["alpha"] == 0.01 and lazy["block_on"] == ["io"] and lazy["remeasure"] == 4


def test_defaults_come_from_the_request_types():
    from harness.gate.compare import Settings
    from harness.gate.driver import GateRequest
    from harness.matrix_run import MatrixRequest

    gate = build_parser().parse_args(["gate", "--from-deps", "main"])
    assert (gate.latency_threshold, gate.alpha, gate.parity_factor) == (
        Settings().latency_threshold, Settings().alpha, Settings().parity_factor)
    assert gate.remeasure == GateRequest("a", "b", Path("m"), Path("r")).remeasure
    matrix = build_parser().parse_args(["matrix"])
    request = MatrixRequest(Path("m"))
    assert (matrix.fresh, matrix.jobs, matrix.provider) == (request.fresh, request.jobs, request.provider)


def test_installed_command_works_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser(workspace=tmp_path).parse_args(["plan"])
    assert args.config == tmp_path / "matrix.yaml" and args.reports == tmp_path / "reports"
    args = build_parser().parse_args(["plan"])       # python -m harness in the checkout
    assert args.config == ROOT / "matrix.yaml" and args.reports == ROOT / "reports"


def test_summary_of_a_finished_run():
    lines = summary(FIXTURE_RUN)
    assert lines[0] == "24 cells: pass 16 · fail 8"
    assert lines[1] == "failures by signature (4):"
    counts = [int(line.split("×")[0]) for line in lines[2:6]]
    assert sum(counts) == 8 and counts == sorted(counts, reverse=True)
    assert any("UnsupportedOperatorError" in line for line in lines[2:6])
    assert lines[-1].startswith("report: ") and lines[-1].endswith("matrix.md")


@pytest.mark.parametrize("terminal, verbose, shown", [
    (False, False, {"pass", "fail"}),          # CI logs: a line per cell, skips left out
    (True, False, {"fail"}),                   # a terminal: the progress bar counts the rest
    (True, True, {"pass", "fail", "skip"}),
    (False, True, {"pass", "fail", "skip"}),
])
def test_which_finished_cells_get_a_line(tmp_path, terminal, verbose, shown):
    from harness.core.record import Record
    from harness.core.status import Status
    from harness.run.annotate import Annotator
    from harness.run.progress import RunProgress
    from harness.run.results_writer import ResultsWriter

    buffer = io.StringIO()
    progress = RunProgress(3, verbose, Console(file=buffer, force_terminal=terminal, width=200))
    writer = ResultsWriter(tmp_path / "results.jsonl", Annotator([]), progress, hold_passes=False)
    for status in ("pass", "fail", "skip"):
        writer.verdict(Record(run_id="r", case=status, torch="2.13.0", exporter="dynamo", opset=18,
                                runtime="ort-cpu", status=Status(status), cell_id=f"cell-{status}",
                                stage="export" if status == "fail" else None,
                                error="boom" if status == "fail" else None))
    printed = {s for s in ("pass", "fail", "skip") if f"cell-{s}" in buffer.getvalue()}
    assert printed == shown
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3   # every cell is recorded
