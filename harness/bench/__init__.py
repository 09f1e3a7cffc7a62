"""The tool's own benchmark (``nox -s bench``, ``python -m harness bench``): speed and memory of
the harness measured side by side in one run (``suite``; ``interleaved``: the interleaved A/B
timing; ``env``: measurements asked of an environment). Its matrix is ``harness/matrices/bench.yaml``."""
