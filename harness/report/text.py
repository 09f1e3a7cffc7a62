"""Untrusted text (case names, errors, hints from records) made safe for markdown tables.

Standard library only, so the gate's reports use it without importing pandas.
"""
from __future__ import annotations

import html
import math
import re
from typing import Any

# C0/C1 control characters (NUL, backspace, escape...): shown as \xNN, never written raw.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_PLAIN_CODE = re.compile(r"^[A-Za-z0-9_.:@+/=-]*$")


def md_text(value: Any, limit: int | None = None) -> str:
    """Any text as safe content of a markdown table cell: one line (every run of whitespace,
    newlines and U+2028 included, becomes one space), control characters shown as ``\\xNN``,
    cut to ``limit`` characters, then raw HTML (``<``, ``>``, ``&``) escaped as entities and ``|``
    as ``\\|`` so that neither a tag renders nor the table breaks."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", " ".join(str(value).split()))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False).replace("|", "\\|")


def md_code(value: Any) -> str:
    """`value` as inline code when it is a plain token (ids, signatures, versions), else as
    escaped text: a code span shows entities literally, so hostile text never goes in one."""
    text = "" if value is None else str(value)
    return f"`{text}`" if text and _PLAIN_CODE.match(text) else md_text(text)
