"""Checks of the tool itself: ``bench`` (speed and memory, `nox -s bench`) and ``gpu`` (the
GPU runtimes on an NVIDIA machine, `nox -s gpu-check`). Each is a subcommand of ``python -m harness``."""
