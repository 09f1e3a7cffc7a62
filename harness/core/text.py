"""Text a case produced, made safe to hash, write and show; names made safe as file names.

A case's exception text, notes and names are data: they may hold anything Python's ``str`` can,
lone surrogates included (``os.fsdecode`` of a file name that is not UTF-8 gives ``'\\udcff'``),
which UTF-8 cannot encode. ``safe_text`` gives the same text with every lone surrogate written out
as an escape: a surrogate that stands for an undecodable byte (``surrogateescape``) as ``\\xff``,
any other as ``\\ud800``; text without surrogates is returned unchanged. Records apply it to
their texts when they are made or read; writers encode with ``ENCODE_ERRORS`` as a second line.

``bounded_name`` is the one way a name becomes (part of) a file name: ``safe_name``'s characters,
at most ``NAME_LIMIT`` of them; a longer one keeps its start and ends in a hash of the whole, so two
long names stay two files and no name reaches the file system over its limit.

Markdown from untrusted text (case names, errors, hints; written by the reports, the gate and a
bundle's ISSUE.md): ``md_text`` one line with raw HTML and control characters escaped, ``md_code``
inline code for plain tokens only, ``md_fenced`` a code block whose fence is longer than any run
of backticks in the text, so nothing in it can end the block.
"""
from __future__ import annotations

import hashlib
import html
import math
import re
from typing import Any

# The error handler every writer of case text uses when it encodes (files, pipes, hashes).
ENCODE_ERRORS = "backslashreplace"
# Longest file-name part made from a name (characters, all ASCII): a cell id or an export
# group id, to which writers add at most a suffix such as '.onnx.data' (NAME_MAX is 255 bytes).
NAME_LIMIT = 200
_HASH_CHARS = 12

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by its escape (``\\xff``, ``\\ud800``): a string
    UTF-8 can always encode. Unchanged (the same object) when it holds none."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(_escape, text)


def encode_text(text: str) -> bytes:
    """UTF-8 bytes of any ``str`` (for hashing and raw writes): never raises."""
    return safe_text(text).encode("utf-8", ENCODE_ERRORS)


def safe_name(text: str, keep: str = "_.@-") -> str:
    """``text`` with every run of characters outside [A-Za-z0-9] and ``keep`` replaced by '_'."""
    return re.sub(rf"[^A-Za-z0-9{re.escape(keep)}]+", "_", text)


def bounded_name(text: str, keep: str = "_.@-", limit: int = NAME_LIMIT) -> str:
    """``safe_name(text)``, or when that is longer than ``limit``: its first characters, '-' and
    a hash of the whole ``text``, ``limit`` characters in all."""
    name = safe_name(text, keep)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(encode_text(text)).hexdigest()[:_HASH_CHARS]
    return f"{name[: limit - _HASH_CHARS - 1]}-{digest}"


# C0/C1 control characters (NUL, backspace, escape...): shown as \xNN, never written raw.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_PLAIN_CODE = re.compile(r"^[A-Za-z0-9_.:@+/=-]*$")


def visible_controls(text: str) -> str:
    """``text`` with each control character but tab and newline written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def md_text(value: Any, limit: int | None = None) -> str:
    """Any text as safe content of a markdown table cell: one line (every run of whitespace,
    newlines and U+2028 included, becomes one space), control characters shown as ``\\xNN``,
    cut to ``limit`` characters, then raw HTML (``<``, ``>``, ``&``) escaped as entities and ``|``
    as ``\\|`` so that neither a tag renders nor the table breaks."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = visible_controls(" ".join(str(value).split()))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False).replace("|", "\\|")


def md_code(value: Any) -> str:
    """`value` as inline code when it is a plain token (ids, signatures, versions), else as
    escaped text: a code span shows entities literally, so hostile text never goes in one."""
    text = "" if value is None else str(value)
    return f"`{text}`" if text and _PLAIN_CODE.match(text) else md_text(text)


def md_fenced(value: Any, info: str = "") -> list[str]:
    """Lines of a fenced code block holding ``value`` verbatim (control characters made
    visible, ``\\r`` line ends dropped): its fence is longer than any backtick run in the text."""
    text = visible_controls(safe_text("" if value is None else str(value)).replace("\r\n", "\n").replace("\r", "\n"))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *text.split("\n"), fence]
