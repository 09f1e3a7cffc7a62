"""What a name the matrix shows (a case, a step) may hold: one check, used by matrix.yaml's
cases and by its pipelines' steps."""
from __future__ import annotations

import unicodedata

# A case's name becomes part of cell ids, file names, logs and every report: at most this many
# characters, printable ones only (see docs/robustness.md).
NAME_MAX_CHARS = 100
# Characters that reorder the text shown around them (bidi embeddings, overrides, isolates,
# marks): a name holding one can show as another name.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a case (None when it can)."""
    if len(name) > NAME_MAX_CHARS:
        return f"expected a name of at most {NAME_MAX_CHARS} characters (this one has {len(name)})"
    if not name:
        return "expected a name of at least 1 character"
    if not name.strip():
        return "expected a name with a visible character"
    if name != name.strip():
        return "expected a name without leading or trailing white space"
    for ch in name:
        code = ord(ch)
        if ch == "\x00":
            return "expected a name without NUL characters"
        if ch in _BIDI:
            return f"expected a name without bidirectional control characters (U+{code:04X})"
        kind = unicodedata.category(ch)
        if kind in ("Cc", "Zl", "Zp"):
            return f"expected a name without control characters (U+{code:04X})"
        if kind in ("Cf", "Cs", "Co", "Cn"):
            return f"expected a name of printable characters (U+{code:04X} is not one)"
    return None
