"""`view`: open a cell's model.onnx (or reduced.onnx) in Netron."""
from __future__ import annotations

import argparse

from harness.cli import _options as opts

HELP = "open a cell's model.onnx (or reduced.onnx) in Netron"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cell", help="cell id (or its key without the torch part, when one run has one match)")
    p.add_argument("--run", default="latest", help="run id or directory (default: latest)")
    p.add_argument("--reduced", action="store_true", help="open reduced.onnx instead of model.onnx")
    p.add_argument("--browse", action=argparse.BooleanOptionalAction, default=None,
                   help="open a browser (default: only when one is available and not in CI)")
    p.add_argument("--port", type=int, default=None, help="port for Netron's server (default: any free one)")
    opts.store(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.report.view import view_cell

    return view_cell(args.cell, args.run, args.reports, reduced=args.reduced, browse=args.browse,
                     port=args.port)
