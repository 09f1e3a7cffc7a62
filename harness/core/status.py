"""Status and stage: the two words every record, report and gate decision is made of."""
from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """A cell's verdict. A ``str`` enum: it serialises as its value and compares equal to it."""

    PASS = "pass"
    FAIL = "fail"
    XFAIL = "xfail"
    XPASS = "xpass"
    SKIP = "skip"
    CRASH = "crash"
    TIMEOUT = "timeout"
    # The matrix's own code failed (preparing inputs, measuring a fact): no verdict on the model.
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    @property
    def is_failure(self) -> bool:
        """The cell did not work: it failed a stage, or its worker crashed or hung."""
        return self in (Status.FAIL, Status.CRASH, Status.TIMEOUT)

    @property
    def passed(self) -> bool:
        """The cell worked (also when it was listed as a known failure)."""
        return self in (Status.PASS, Status.XPASS)

    @property
    def attempted(self) -> bool:
        """The cell ran far enough to count in a pass rate (a skip is not an attempt, nor is a
        cell the matrix's own code failed on)."""
        return self not in (Status.SKIP, Status.ERROR)

    @property
    def worker_died(self) -> bool:
        return self in (Status.CRASH, Status.TIMEOUT)

    @property
    def is_own_error(self) -> bool:
        """The project's own code failed on this cell: not a verdict on the model (neither a
        failure nor an attempt), counted apart and never reused from the store."""
        return self is Status.ERROR


class Stage(str, enum.Enum):
    """The stages of a cell, in order; a failed cell names the first one that failed.

    ``reference``: the case is built and run in torch eager (the references parity compares
    against); a case that raises, returns inputs that do not fit, or whose model raises at the
    example inputs fails here, before anything is exported.
    """

    REFERENCE = "reference"
    EXPORT = "export"
    CHECK = "check"
    # A step of the cell's post-export pipeline (harness.worker.steps); the record's graph fact
    # ``pipeline`` names which one.
    STEP = "step"
    LOAD = "load"
    RUN = "run"
    PARITY = "parity"
    LATENCY = "latency"

    def __str__(self) -> str:
        return self.value


STAGES = tuple(s.value for s in Stage)
