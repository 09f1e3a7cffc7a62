"""Built-in trap probes (see shared TRAPS.md): name → 'module:function'."""
from __future__ import annotations

PROBES: dict[str, str] = {
    "mha": "harness.probes.attention:mha",
    "repeat_interleave": "harness.probes.shapes:repeat_interleave",
    "conv_bn": "harness.probes.vision:conv_bn",
}

# Names usable in matrix.yaml as a whole group of cases.
GROUPS: dict[str, list[str]] = {
    "probes": list(PROBES),
}
