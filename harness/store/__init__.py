"""The results store: ``reports/runs/<run-id>/`` (results.jsonl + run.json), the index and the
``latest`` pointer (``runs``); provenance of results (``provenance``: fingerprints, same-code
checks); merging shard runs into one run (``merge``).

Takes ``Record`` and ``RunMeta`` from ``harness.core``; gives them to the runner, reports and gate.
"""
