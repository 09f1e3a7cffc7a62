"""An exception as one line, defined once: what a record's ``error``, a runtime release's answer
and a diagnosis keep of an exception (the traceback goes to the cell's log). Standard library
only: the worker and the runtime-only environments import it.
"""
from __future__ import annotations

import re
from typing import Callable

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(exc: BaseException) -> str:
    """The first non-empty line of the exception's message, without terminal colours."""
    lines = [ln for ln in _ANSI.sub("", str(exc)).strip().splitlines() if ln.strip()]
    return lines[0].strip() if lines else ""


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its ``raise ... from`` causes, outermost first."""
    chain, seen = [exc], {id(exc)}
    while (nxt := chain[-1].__cause__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        chain.append(nxt)
    return chain


def root_cause(exc: BaseException) -> BaseException:
    """The most specific cause of ``exc``: the innermost exception of its ``__cause__`` chain
    (``raise ... from``), the link exporters and runtimes use to wrap the error that stopped them.

    An implicit ``__context__`` (an exception that was being handled when ``exc`` was raised) is
    never followed: torch.export and the exporters catch and retry internally, and the exception
    their handler was looking at is unrelated to the one that ends the export.
    """
    return exception_chain(exc)[-1]


def short_error(exc: BaseException, limit: int = 500, cause: bool = True) -> str:
    """'Type: first line', plus (``cause``) the root cause when the outer message is a generic
    wrapper; at most ``limit`` characters."""
    text = f"{type(exc).__name__}: {first_line(exc)}"
    root = root_cause(exc)
    if cause and root is not exc and not (first_line(root) and first_line(root) in text):
        text += f" <- {type(root).__name__}: {first_line(root)}".rstrip(": ")
    return text[:limit]


def whole_error(exc: BaseException, limit: int = 600, clean: Callable[[str], str] | None = None) -> str:
    """'Type: message' with every line of the message joined on one (a runtime's own message,
    whose first line alone often names only where it failed); ``clean`` edits the text first."""
    text = f"{type(exc).__name__}: {exc}"
    return " ".join((clean(text) if clean else text).split())[:limit]
