"""What runs inside an environment: torch, the exporters and the runtimes are installed there,
the tool's own dependencies (pydantic, pandas, rich, yaml, ...) are not.

``main`` (``python -m harness.worker``: the job loop and its event stream), ``group_process``
(the warm parent and a forked process per export group), ``stages`` (reference → export → check
→ load → run → parity → latency), the case (``cases``, ``inputs``, ``loaded``), the export
(``export``, ``export_optimum``, ``export_log``, ``dims``, ``determinism``), the verdict
(``parity``, ``second_shape``, ``noise``), the timing (``latency``, ``machine_load``), the log
(``logcap``), the spool between phases (``spool``). ``diagnose/``: why a cell failed (blame,
divergence, the ONNX reference, repro, bundle, reduction). ``runtime_only/``: what runs in an
environment without torch. ``existing_facts`` runs in an existing interpreter, ``bench_latency``
in the bench's environment.

Imports only the standard library, numpy, ``harness.core``, ``harness.runtimes`` and
``harness.probes`` at module level; torch, onnx and the runtimes lazily.
"""
