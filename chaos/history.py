"""Operation histories: invoke / ok / fail / info events, kept in memory and in ``history.sqlite``.

Jepsen's vocabulary: a client *process* invokes an operation (``invoke``) and later learns its outcome:
``ok`` (it happened), ``fail`` (it definitely did not happen, e.g. rejected before it was proposed) or
``info`` (unknown: a timeout, a lost leader after the proposal).  An ``info`` operation may take effect at
any time after its invocation, so checkers treat its completion time as +infinity.  A process has at
most one operation in flight; after an ``info`` the caller should continue as a new process id, as
Jepsen does, because the old one may still be "executing".

Timestamps are ``time.monotonic_ns()`` (injectable), comparable only within one run.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

HISTORY_FILE = "history.sqlite"


class EventType(enum.Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Event:
    """One history row.  ``op_id`` joins an invoke with its completion."""

    index: int
    op_id: int
    type: EventType
    process: int
    f: str
    key: str | None
    value: Any
    result: Any
    error: str | None
    time_ns: int


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion (``complete_ns`` is None while pending or for info)."""

    op_id: int
    process: int
    f: str
    key: str | None
    value: Any
    outcome: EventType  # OK, FAIL or INFO (INFO also for operations that never completed)
    result: Any
    error: str | None
    invoke_ns: int
    complete_ns: int | None

    @property
    def end_ns(self) -> float:
        """Latest time the operation could have taken effect: +inf when its outcome is unknown."""
        if self.outcome is EventType.INFO or self.complete_ns is None:
            return float("inf")
        return float(self.complete_ns)

    def describe(self) -> str:
        """A short name for reports: ``op#12 p3 create(t-7)=ok 'created'``."""
        target = "" if self.key is None else self.key
        result = "" if self.result is None else f" {self.result!r}"
        return f"op#{self.op_id} p{self.process} {self.f}({target})={self.outcome.value}{result}"


class HistoryError(Exception):
    """Misuse of the recorder: completing an unknown operation, two operations in flight on a process."""


class History:
    """An append-only, in-memory history; ``HistoryStore`` persists the same events to SQLite."""

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._events: list[Event] = []
        self._pending: dict[int, Event] = {}  # op_id -> invoke event
        self._busy: dict[int, int] = {}  # process -> op_id in flight
        self._next_op_id = 0

    def invoke(self, process: int, f: str, key: str | None = None, value: Any = None) -> Event:
        if process in self._busy:
            raise HistoryError(f"process {process} already has op#{self._busy[process]} in flight")
        op_id = self._next_op_id
        self._next_op_id += 1
        event = Event(
            len(self._events), op_id, EventType.INVOKE, process, f, key, value, None, None, self._clock_ns()
        )
        self._events.append(event)
        self._pending[op_id] = event
        self._busy[process] = op_id
        return event

    def complete(self, op_id: int, outcome: EventType, result: Any = None, error: str | None = None) -> Event:
        if outcome is EventType.INVOKE:
            raise HistoryError("a completion must be ok, fail or info")
        invoked = self._pending.pop(op_id, None)
        if invoked is None:
            raise HistoryError(f"op#{op_id} is not in flight")
        del self._busy[invoked.process]
        event = Event(
            len(self._events),
            op_id,
            outcome,
            invoked.process,
            invoked.f,
            invoked.key,
            invoked.value,
            result,
            error,
            self._clock_ns(),
        )
        self._events.append(event)
        return event

    def ok(self, op_id: int, result: Any = None) -> Event:
        return self.complete(op_id, EventType.OK, result)

    def fail(self, op_id: int, error: str, result: Any = None) -> Event:
        return self.complete(op_id, EventType.FAIL, result, error)

    def info(self, op_id: int, error: str) -> Event:
        return self.complete(op_id, EventType.INFO, None, error)

    @property
    def events(self) -> list[Event]:
        return list(self._events)

    def operations(self) -> list[Operation]:
        return pair_operations(self._events)


def pair_operations(events: Iterable[Event]) -> list[Operation]:
    """Join invokes with completions, in invocation order; unfinished invocations become ``info``."""
    invokes: dict[int, Event] = {}
    completions: dict[int, Event] = {}
    for event in events:
        if event.type is EventType.INVOKE:
            invokes[event.op_id] = event
        else:
            completions[event.op_id] = event
    operations: list[Operation] = []
    for op_id, invoked in sorted(invokes.items(), key=lambda item: (item[1].time_ns, item[1].index)):
        done = completions.get(op_id)
        operations.append(
            Operation(
                op_id=op_id,
                process=invoked.process,
                f=invoked.f,
                key=invoked.key,
                value=invoked.value,
                outcome=done.type if done is not None else EventType.INFO,
                result=done.result if done is not None else None,
                error=done.error if done is not None else "never completed",
                invoke_ns=invoked.time_ns,
                complete_ns=done.time_ns if done is not None else None,
            )
        )
    return operations


_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    idx INTEGER PRIMARY KEY,
    op_id INTEGER NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('invoke', 'ok', 'fail', 'info')),
    process INTEGER NOT NULL,
    f TEXT NOT NULL,
    key TEXT,
    value TEXT,
    result TEXT,
    error TEXT,
    time_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_op ON events (op_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _to_row(event: Event) -> tuple[Any, ...]:
    return (
        event.index,
        event.op_id,
        event.type.value,
        event.process,
        event.f,
        event.key,
        json.dumps(event.value),
        json.dumps(event.result),
        event.error,
        event.time_ns,
    )


def _from_row(row: Sequence[Any]) -> Event:
    return Event(
        index=row[0],
        op_id=row[1],
        type=EventType(row[2]),
        process=row[3],
        f=row[4],
        key=row[5],
        value=json.loads(row[6]),
        result=json.loads(row[7]),
        error=row[8],
        time_ns=row[9],
    )


class HistoryStore:
    """A :class:`History` whose every event is also committed to an SQLite file (one file per run).

    Values and results must be JSON-serialisable.  WAL mode keeps a commit per event cheap, and a
    crashed harness leaves every event recorded up to the crash.
    """

    def __init__(self, db: aiosqlite.Connection, history: History) -> None:
        self._db = db
        self.history = history

    @classmethod
    async def create(cls, path: Path, clock_ns: Callable[[], int] = time.monotonic_ns) -> HistoryStore:
        """Start a new history file at ``path``; an existing file is refused (one file per run)."""
        if path.exists():  # noqa: ASYNC240 - one stat before the run starts
            raise HistoryError(f"{path} already exists; use a fresh report directory per run")
        db = await aiosqlite.connect(path)
        await db.execute("PRAGMA journal_mode=WAL")
        await db.executescript(_SCHEMA)
        await db.commit()
        return cls(db, History(clock_ns))

    async def set_meta(self, key: str, value: Any) -> None:
        statement = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
        await self._db.execute(statement, (key, json.dumps(value)))
        await self._db.commit()

    async def _persist(self, event: Event) -> Event:
        await self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _to_row(event))
        await self._db.commit()
        return event

    async def invoke(self, process: int, f: str, key: str | None = None, value: Any = None) -> Event:
        return await self._persist(self.history.invoke(process, f, key, value))

    async def complete(
        self, op_id: int, outcome: EventType, result: Any = None, error: str | None = None
    ) -> Event:
        return await self._persist(self.history.complete(op_id, outcome, result, error))

    async def close(self) -> None:
        await self._db.close()


async def load_events(path: Path) -> list[Event]:
    """Every event of a history file, in recording order."""
    async with aiosqlite.connect(path) as db, db.execute("SELECT * FROM events ORDER BY idx") as cursor:
        rows = await cursor.fetchall()
    return [_from_row(row) for row in rows]


async def load_meta(path: Path) -> dict[str, Any]:
    async with aiosqlite.connect(path) as db, db.execute("SELECT key, value FROM meta") as cursor:
        rows = await cursor.fetchall()
    return {row[0]: json.loads(row[1]) for row in rows}
