"""Post-processing of records as they arrive: failure signatures, hints, known failures (xfail)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from harness.core.record import Record
from harness.core.status import Status
from harness.core.text import encode_text
from harness.matrix.rules import matches

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TYPE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*(.*)$", re.S)
# A sentence ends at a period after a word, a quote or a bracket, followed by space or the end;
# "torch.export." ends one, "aten.repeat_interleave" and "0.001;" do not.
_SENTENCE_END = re.compile(r"(?<=[\w)\]'\"`>])\.(?=\s|$)")

# Order matters: quoted names and dict literals go before paths and numbers eat their insides.
_NORMALIZERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"'[^']*[/\\][^']*'|\"[^\"]*[/\\][^\"]*\""), "<name>"),  # node names, files
    (re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}"), "<dict>"),  # shapes / dynamic dims given back
    # which dims a graph rejects depends on the case's dim names; the bug is the same
    (re.compile(r"rejected when growing .*?\(dynamic dims <dict>\)"), "rejected when growing <dims>"),
    (re.compile(r"\[[\d\s,.+-]*\]"), "<list>"),  # shapes and element indices
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"(?<![\w.])(?:/[\w.+@-]+)+/?"), "<path>"),
    (re.compile(r"\b(?:[\w.-]*[A-Za-z][\w.-]*/)+[\w.-]+"), "<path>"),
    (re.compile(r"\b(?:node|Node)(?: name)?[ _:]*\(?['\"]?[\w/.:-]+['\"]?\)?"), "node <name>"),
    (re.compile(r"\b[suq]\d+\b"), "<sym>"),  # torch.export symbols (s0, u1) renumber per model
    (re.compile(r"(?<![A-Za-z])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def first_sentence(text: str) -> str:
    """The first non-empty line, cut at its first sentence end.

    Upstream messages keep their first sentence across releases and change the advice after
    it (the SDPA-at-opset-13 error ends differently on torch 2.6 and 2.9).
    """
    lines = [ln for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[0].strip()
    end = _SENTENCE_END.search(line)
    return line[:end.start()] if end else line


def _normalize_part(part: str) -> str:
    """'Type: message' -> 'Type: first sentence, with volatile tokens replaced'."""
    m = _TYPE.match(part)
    exc_type, message = (m.group(1), m.group(2)) if m and " " not in m.group(1) else ("", part)
    text = first_sentence(message)
    for pattern, repl in _NORMALIZERS:
        text = pattern.sub(repl, text)
    text = text.strip()
    return f"{exc_type}: {text}" if exc_type else text


def normalize_error(error: str) -> str:
    """Stable text of an error: per cause ('outer <- root'), type + normalized first sentence.

    Addresses, paths, node names, numbers, shapes and the advice after the first sentence vary
    across torch versions, exporters and opsets for one upstream bug; they are dropped.
    """
    parts = [_normalize_part(p) for p in _ANSI.sub("", error or "").split(" <- ")]
    return " <- ".join(p for p in parts if p)[:300]


def signature(rec: Record) -> str | None:
    """Stable id of a failure: stage + exception type + normalized message."""
    if not rec.status.is_failure and rec.status is not Status.XFAIL:
        return None
    norm = normalize_error(rec.error or "")
    digest = hashlib.sha1(encode_text(f"{rec.stage}|{norm}")).hexdigest()[:8]
    return f"{rec.stage or 'worker'}:{digest}"


HINTS_FILE = Path(__file__).with_name("hints.yaml")


def load_hints(path: Path = HINTS_FILE) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return yaml.safe_load(path.read_text()) or []


def suggests_exporter(hint: str, exporter: str) -> bool:
    """Whether ``hint`` tells the user to use ``exporter`` (never said to a cell already using it)."""
    return re.search(rf"\b(?:use|try|switch to|with)\s+the\s+{re.escape(exporter)}\s+exporter\b",
                     hint, re.I) is not None


def hint_for(rec: Record, hints: list[tuple[re.Pattern[str], dict[str, Any]]]) -> str | None:
    """The first hint whose pattern matches the error, whose ``stage`` and ``exporter`` (when
    given) are the cell's, that does not suggest the exporter the cell already uses, and whose
    ``parties`` (when given) hold the party the cell's blame names (``requires_blame``: never
    for a record without one): a hint is only given where the cell's own facts fit it."""
    for pattern, hint in hints:
        if (pattern.search(rec.error or "") and hint.get("stage", rec.stage) == rec.stage
                and hint.get("exporter", rec.exporter) == rec.exporter
                and not suggests_exporter(hint["hint"], rec.exporter)
                and (rec.blame is None or rec.blame.party in hint.get("parties", [rec.blame.party]))
                and (rec.blame is not None or not hint.get("requires_blame"))
                and ("max_rel_below" not in hint or _max_rel(rec) < float(hint["max_rel_below"]))):
            return hint["hint"]
    return None


_MAX_REL = re.compile(r"max_rel=([-+0-9.eE]+|inf|nan)")


def _max_rel(rec: Record) -> float:
    """The worst relative error of a parity failure: the record's, else the one its error names."""
    if rec.parity.max_rel is not None:
        return float(rec.parity.max_rel)
    found = _MAX_REL.search(rec.error or "")
    try:
        return float(found.group(1)) if found else float("inf")
    except ValueError:
        return float("inf")


class Annotator:
    def __init__(self, xfail: list[Any] | None = None, hints: list[dict[str, Any]] | None = None) -> None:
        self.xfail = xfail or []
        self.hints = [(re.compile(h["pattern"], re.I), h) for h in (hints if hints is not None else load_hints())]

    def __call__(self, rec: Record) -> Record:
        axes = {"torch": rec.torch, **rec.key.axes}
        known = next((x for x in self.xfail if matches(x.match, axes)), None)
        if known is not None:
            if rec.status.is_failure:
                rec.status = Status.XFAIL
                rec.reason = f"{known.reason} ({known.link})"
            elif rec.status is Status.PASS:
                rec.status = Status.XPASS
                rec.reason = f"listed as known failure but passes: {known.reason} ({known.link})"
        rec.signature = signature(rec)
        if rec.error:
            rec.hint = self.hint(rec)
        return rec

    def hint(self, rec: Record) -> str | None:
        """The cell's hint: its blame's (the layer, whose, the remedies seen to work or "nothing
        tried works"; ``harness.run.post.remedies`` adds the matrix's own after the run), then the
        advice its facts or a known pattern give, said as not tried; records without a layer
        keep the advice alone, as before."""
        layered = rec.blame.hint() if rec.blame is not None and rec.status.is_failure else None
        if not layered:
            return fact_hint(rec) or hint_for(rec, self.hints)
        blame = rec.blame
        # The export log's facts speak of the model's code: advice only where the blame is the
        # model's. A documented limitation of the model or a runtime has its documentation as
        # advice, not a pattern's generic "a runtime bug" / "a size turned into a constant".
        advice = fact_hint(rec) if blame.party == "model-code" else None
        if advice is None and not (blame.kind == "documented limitation"
                                   and (blame.party == "model-code" or blame.party.startswith("runtime"))):
            advice = hint_for(rec, self.hints)
        return f"{layered}. Advice (not tried here): {advice}" if advice else layered


def fact_hint(rec: Record) -> str | None:
    """A failing cell whose own record says which dim torch fixed and why (``graph.export_specialised``:
    a silent re-export or the export's failure, with the model's line; ``graph.specialised`` with
    an example size of 0 or 1) gets the remedy that fits that cause, not a generic one."""
    if not rec.status.is_failure or rec.stage not in ("export", "run", "parity"):
        return None
    graph = rec.graph or {}
    for fact in graph.get("export_specialised") or []:
        if isinstance(fact, dict) and fact.get("remedy"):
            at = f" at {fact['source']}" if fact.get("source") else ""
            return f"torch.export fixed {fact.get('dim')} to {fact.get('value')}{at}: {fact['remedy']}"
    if rec.stage == "export":
        return None
    zero_one = [f for f in graph.get("specialised") or [] if isinstance(f, dict)
                and f.get("value") in (0, 1) and f.get("example") == f.get("value")]
    zero_one += [f for f in graph.get("zero_one") or [] if isinstance(f, dict)]
    for fact in zero_one:
        return (f"{fact.get('dim')} has example size {fact.get('example')}, which torch.export specialises "
                f"(the file fails when {fact.get('dim')} grows): give an example with {fact.get('dim')} >= 2 "
                "(or the case's own second_inputs)")
    return None
