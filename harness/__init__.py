"""torch → ONNX compatibility matrix. The packages follow the data flow, and each imports only
from those before it:

    core ─▶ probes, runtimes ─▶ matrix ─▶ envs ─▶ store ─▶ run ─▶ report ─▶ gate ─▶ cli

- ``core``: the types on every arrow (status, cell key, job, record, run metadata, env spec);
- ``probes`` / ``runtimes``: built-in cases and runtime adapters (imported inside workers);
- ``matrix``: matrix.yaml → ``Plan`` (environments × cells), rules, shards;
- ``envs``: the ``Provider`` protocol and its uv-venv and Docker realisations;
- ``store``: run directories, the index, provenance (fingerprints), merging shards;
- ``run``: executing a plan (supervisor) and the worker inside each environment;
- ``report``: pandas aggregation, markdown, HTML, plots;
- ``gate``: the upgrade gate;
- ``cli``: ``python -m harness`` with every subcommand (the nox sessions call it).
"""
from __future__ import annotations

__version__ = "0.1.0"
