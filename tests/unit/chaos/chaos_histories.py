"""Helpers to write histories by hand in checker tests: intervals in abstract time units."""

from __future__ import annotations

from typing import Any

from chaos.history import EventType, Operation

_next_id = iter(range(1_000_000))


def op(
    f: str,
    invoke: int,
    complete: int | None,
    *,
    key: str | None = "k",
    value: Any = None,
    result: Any = None,
    outcome: EventType = EventType.OK,
    process: int = 0,
) -> Operation:
    """An operation invoked at ``invoke`` and completed at ``complete`` (None = never, i.e. info)."""
    if complete is None and outcome is EventType.OK:
        outcome = EventType.INFO
    return Operation(
        op_id=next(_next_id),
        process=process,
        f=f,
        key=key,
        value=value,
        outcome=outcome,
        result=result,
        error=None if outcome is EventType.OK else outcome.value,
        invoke_ns=invoke,
        complete_ns=complete,
    )
