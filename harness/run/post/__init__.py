"""Passes after the verdicts, driven from the runner: ``runtime_floors`` (each passing file on
other runtime releases, in runtime-only environments) and ``reduce`` (a failing file reduced in
its cell's environment). Their environment halves are ``harness.worker.runtime_only`` and
``harness.worker.diagnose.reduce``."""
