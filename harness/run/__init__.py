"""The runner: the tool's own process (no torch, no onnx, no runtime). A request becomes a held
run directory (``execute``), its cells are scheduled over environments (``scheduler``,
``workqueue``), each environment's worker process is supervised (``supervisor``, ``timeouts``,
``processes``, ``logrelay``), every record is written once (``results_writer``) and shown
(``progress``, ``annotate``); the latency phase is confirmed (``confirm``) and A/B timed
(``ab``). ``post/``: the passes after the verdicts that drive environments from this side.

What runs inside an environment is ``harness.worker``; what both sides share is
``harness.core.wire``. Nothing here imports ``harness.worker``.
"""
