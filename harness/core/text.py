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
"""
from __future__ import annotations

import hashlib
import re

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
