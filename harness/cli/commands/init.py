"""`init`: write a starter matrix and a gate workflow for this repository."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write a starter matrix and a gate workflow for this repository"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="name of the matrix file (default: matrix.yaml)")
    p.add_argument("--tool", default="torch-onnx-matrix",
                   help="what the workflow installs with pip (default: torch-onnx-matrix; a version or git URL)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """A starter matrix file and a gate workflow for the repository in the current directory."""
    from harness.matrix.scaffold import write_scaffold

    for line in write_scaffold(Path.cwd(), args.config.name if args.config else "matrix.yaml",
                               args.tool, args.force):
        print(line)
    print("next: torch-onnx-matrix plan, then torch-onnx-matrix matrix")
    return 0
