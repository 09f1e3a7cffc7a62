"""``python -m harness.worker``: the worker (``harness.worker.main``)."""
from __future__ import annotations

import sys

from harness.worker.main import main

sys.exit(main())
