"""The result every checker returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"  # e.g. the linearizability search hit its budget, or no data to judge


@dataclass(frozen=True, slots=True)
class Verdict:
    """A checker's judgement.  ``offending`` names the operations / nodes / offsets at fault."""

    checker: str
    status: Status
    summary: str
    offending: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.PASS

    def to_json(self) -> dict[str, Any]:
        return {
            "checker": self.checker,
            "status": self.status.value,
            "summary": self.summary,
            "offending": list(self.offending),
            "details": self.details,
        }


def passed(checker: str, summary: str, **details: Any) -> Verdict:
    return Verdict(checker, Status.PASS, summary, (), details)


def failed(checker: str, summary: str, offending: list[str], **details: Any) -> Verdict:
    return Verdict(checker, Status.FAIL, summary, tuple(offending), details)


def unknown(checker: str, summary: str, **details: Any) -> Verdict:
    return Verdict(checker, Status.UNKNOWN, summary, (), details)
