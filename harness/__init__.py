"""torch → ONNX compatibility matrix: plan, environments, export-and-infer worker, reports."""
from __future__ import annotations

__version__ = "0.1.0"
SCHEMA_VERSION = 1
