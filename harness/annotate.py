"""Post-processing of records as they arrive: failure signatures, hints, known failures (xfail)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from harness.plan import matches
from harness.records import Record, Status

_NORMALIZERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"(?:/[\w.+@-]+)+/?"), "<path>"),
    (re.compile(r"'[^']*\.onnx'"), "<file>"),
    (re.compile(r"\b(?:node|Node)[ _]?\(?['\"]?[\w/.:-]+['\"]?\)?"), "node <name>"),
    (re.compile(r"(?<![A-Za-z])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalize_error(error: str) -> str:
    text = error
    for pattern, repl in _NORMALIZERS:
        text = pattern.sub(repl, text)
    return text.strip()[:300]


def signature(rec: Record) -> str | None:
    """Stable id of a failure: stage + exception type + normalized message."""
    if not Status(rec.status).is_failure and rec.status != Status.XFAIL.value:
        return None
    norm = normalize_error(rec.error or "")
    digest = hashlib.sha1(f"{rec.stage}|{norm}".encode()).hexdigest()[:8]
    return f"{rec.stage or 'worker'}:{digest}"


HINTS_FILE = Path(__file__).with_name("hints.yaml")


def load_hints(path: Path = HINTS_FILE) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return yaml.safe_load(path.read_text()) or []


class Annotator:
    def __init__(self, xfail: list[Any] | None = None, hints: list[dict[str, Any]] | None = None) -> None:
        self.xfail = xfail or []
        self.hints = [(re.compile(h["pattern"], re.I), h) for h in (hints if hints is not None else load_hints())]

    def __call__(self, rec: Record) -> Record:
        axes = {"torch": rec.torch, "exporter": rec.exporter, "opset": rec.opset,
                "runtime": rec.runtime, "case": rec.case, **rec.options}
        known = next((x for x in self.xfail if matches(x.match, axes)), None)
        if known is not None:
            if Status(rec.status).is_failure:
                rec.status = Status.XFAIL.value
                rec.reason = f"{known.reason} ({known.link})"
            elif rec.status == Status.PASS.value:
                rec.status = Status.XPASS.value
                rec.reason = f"listed as known failure but passes: {known.reason} ({known.link})"
        rec.signature = signature(rec)
        if rec.error:
            for pattern, hint in self.hints:
                if pattern.search(rec.error) and hint.get("stage", rec.stage) == rec.stage:
                    rec.hint = hint["hint"]
                    break
        return rec
