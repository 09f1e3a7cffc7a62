"""Untrusted text (case names, errors, hints from records) made safe for markdown tables.

The one definition is ``harness.core.text`` (a bundle's ISSUE.md, written in the worker, uses it
too); the reports import it from here. Standard library only, so the gate's reports use it
without importing pandas.
"""
from __future__ import annotations

from harness.core.text import md_code, md_fenced, md_text

__all__ = ["md_code", "md_fenced", "md_text"]
