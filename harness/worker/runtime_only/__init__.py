"""What runs in a runtime-only environment (one runtime release, numpy and onnx, no torch):
``release_check`` (a spooled file loaded, run and compared on one release) and ``ab_timer``
(several files timed in random order per round). Imports nothing that imports torch."""
