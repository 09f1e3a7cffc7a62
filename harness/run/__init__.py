"""Running a plan. Runner side: ``execute`` (environments in order, records appended durably,
run.json kept current) and ``supervisor`` (one worker process per environment, crash and
timeout containment), ``annotate`` (signatures, hints, xfail). Worker side, inside each
environment: ``worker`` (the job loop and its event stream), ``stages`` (export → check → load →
run → parity → latency), ``cases``, ``export``, ``parity``, ``latency``, ``bundle``.

Takes a ``Plan`` and a ``Provider``; the worker takes a ``Job`` and emits ``Record``s.
Worker-side modules import only the standard library, numpy and ``harness.core`` at module level.
"""
