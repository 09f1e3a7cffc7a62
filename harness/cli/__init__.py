"""Command line: ``torch-onnx-matrix SUBCOMMAND`` (installed) or ``python -m harness SUBCOMMAND``
(in a checkout): every entry point of the tool.

One module per subcommand in ``harness/cli/commands/`` (``HELP``, ``add_arguments``, ``run``),
options shared by several in ``_options``, the one console in ``logger``. A subcommand's module
is imported only when it is the one asked for (or for the whole parser, as the docs test builds
it), and its heavy imports happen inside ``run``: ``--help`` loads neither scipy nor pandas.

matrix, plan, merge, report, publish, history, gate, bisect, reduce, view, advise, images, base-image, bench,
gpu-check, init; the nox sessions of the same names call these. Exit codes: 0 success; 1 a finding
(gate regression, a failed image build, a broken GPU runtime, nothing to bisect); 2 bad input
(a config, an argument, a store, an environment that cannot be installed); 3 an unexpected error
(one line on stderr, the traceback in a file it names); 128 + N interrupted by signal N (the run
is resumable). The gate never exits 1 but for a regression: any error there is 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from harness.cli import _options
from harness.cli.logger import error
from harness.core.record import SchemaError
from harness.core.text import ENCODE_ERRORS
from harness.matrix.rules import ConfigError

PROG = "torch-onnx-matrix"
# name -> (module in harness.cli.commands, one-line help); the order of `--help`.
COMMANDS = {
    "init": ("init", "write a starter matrix and a gate workflow for this repository"),
    "matrix": ("matrix", "run a matrix"),
    "plan": ("plan", "print environments and cells without running them; shard them for CI"),
    "merge": ("merge", "merge finished shard runs into one run"),
    "report": ("report", "re-render reports from stored results"),
    "publish": ("publish", "write a static site of every run (GitHub Pages ready)"),
    "history": ("history", "keep every night: append a run to the history, publish its site, check it is current"),
    "gate": ("gate", "compare a candidate torch against a baseline; exit 1 on regression"),
    "bisect": ("bisect", "find the torch release where a cell's verdict changes"),
    "view": ("view", "open a cell's model.onnx (or reduced.onnx) in Netron"),
    "advise": ("advise", "which torch / exporter / opset / options to ship a case with, per runtime"),
    "reduce": ("reduce", "reduce failing cells' files to the smallest graph that still fails"),
    "images": ("images", "build the Docker images a matrix needs"),
    "base-image": ("base_image", "bootstrap the local base image for offline builds"),
    "bench": ("bench", "benchmark the tool itself (environment reuse, throughput, timing overhead)"),
    "gpu-check": ("gpu_check", "run the probes on the GPU runtimes and print one line per cell"),
}


def command_module(name: str):
    return importlib.import_module(f"harness.cli.commands.{COMMANDS[name][0]}")


def _asked_for(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is one, past the global options)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--reports":
            skip = True
        elif word in COMMANDS:
            return word
        elif not word.startswith("-"):
            return None
    return None


def build_parser(workspace: Path | None = None, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the subcommand it names gets its options (the others are
    listed by name), so that nothing but that subcommand's module is imported."""
    from harness.core.paths import REPORTS

    _options._WORKSPACE[:] = [workspace] if workspace is not None else []
    parser = argparse.ArgumentParser(prog=PROG, description="Know before you bump PyTorch whether your "
                                     "models still export to ONNX and run on every runtime you ship to.")
    parser.add_argument("--reports", type=Path, default=workspace / "reports" if workspace else REPORTS,
                        help="results store (default: reports/)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    wanted = _asked_for(argv) if argv is not None else None
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv is None or name == wanted:
            command_module(name).add_arguments(p)
    return parser


def _resolve_paths(args: argparse.Namespace) -> None:
    """Relative --config / --output / --reports are relative to where the user ran the command
    (nox changes into the project root before running a session)."""
    invoked = os.environ.get("HARNESS_INVOKED_FROM")
    if not invoked:
        return
    for name in ("config", "output", "reports"):
        value = getattr(args, name, None)
        if isinstance(value, Path) and not value.is_absolute():
            candidate = Path(invoked) / value
            if name != "config" or candidate.exists() or not value.exists():
                setattr(args, name, candidate)


# Exit codes (see the module docstring).
BAD_INPUT, INTERNAL_ERROR, INTERRUPTED = 2, 3, 130


def _check_paths(args: argparse.Namespace) -> None:
    """Output folders must be folders: a file there is bad input, never a traceback later."""
    for name, option in (("output", "--output"), ("site", "--site"), ("reports", "--reports")):
        value = getattr(args, name, None)
        if isinstance(value, Path) and value.exists() and not value.is_dir():
            raise ConfigError(f"{option} {value}: is a file; expected a directory")


def _traceback_file(args: argparse.Namespace) -> Path | None:
    """Write the current exception's traceback where the user will look; return its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = f"error-{args.command}-{stamp}-{os.getpid()}.log"
    text = f"{PROG} {' '.join(sys.argv[1:])}\n\n{traceback.format_exc()}"
    reports = getattr(args, "reports", None)
    for folder in ([reports / "errors"] if isinstance(reports, Path) else []) + [Path(tempfile.gettempdir())]:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text, encoding="utf-8", errors=ENCODE_ERRORS)
            return folder / name
        except OSError:
            continue
    return None


def console_main() -> int:
    """The installed `torch-onnx-matrix` command: a matrix file and store in the current directory."""
    return main(workspace=Path.cwd(), prog=PROG)


def _safe_streams() -> None:
    """Console output of any text (a case's error with a lone surrogate) never raises."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors=ENCODE_ERRORS)
            except (ValueError, OSError):
                pass


def main(argv: list[str] | None = None, workspace: Path | None = None, prog: str = "python -m harness") -> int:
    _safe_streams()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(workspace, argv)
    parser.prog = prog
    args = parser.parse_args(argv)
    _resolve_paths(args)
    gate = args.command == "gate"
    try:
        _check_paths(args)
        code = args.func(args)
        # The gate's contract is 0 (no regression), 1 (regression), 2 (could not tell).
        return code if not gate or code in (0, 1) else BAD_INPUT
    except (ConfigError, FileNotFoundError, SchemaError) as exc:
        error(str(exc))
        return BAD_INPUT
    except KeyboardInterrupt as exc:
        # A run interrupted by SIGTERM/SIGINT/SIGHUP (harness.run.signals.RunInterrupted) has
        # stopped its workers and stays resumable; the exit code is the shell's for that signal.
        error("interrupted")
        return BAD_INPUT if gate else 128 + getattr(exc, "signum", INTERRUPTED - 128)
    except SystemExit as exc:
        # sys.exit("message") deep inside is bad input; a bare code passes through, except in the
        # gate, whose verdict only run_gate's return value gives.
        if isinstance(exc.code, str) or gate:
            error(str(exc.code) if isinstance(exc.code, str) else f"'gate' stopped early (exit {exc.code})")
            return BAD_INPUT
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes an exit code
        where = _traceback_file(args)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        error(f"unexpected {type(exc).__name__} in '{args.command}': {first} "
             f"(traceback: {where or 'could not be written'})")
        return BAD_INPUT if gate else INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
