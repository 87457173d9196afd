"""A Wing-Gong / Lowe (WGL) linearizability checker with memoisation, as in Porcupine and Knossos.

Theory of operation.  A history is linearizable if every operation can be given a single point in time
between its invocation and its completion such that, applied in that order, a sequential *model*
produces exactly the results the clients saw.  The search (Lowe's refinement of Wing & Gong):

* state = (set of operations already linearized, model state); start with (∅, model.init()).
* the operations that may go next are the *minimal* ones: not yet linearized and invoked no later than
  the earliest completion among the remaining ones (anything invoked after that completion must come
  after that operation in real time);
* try each candidate through ``model.step``; recurse; backtrack on a dead end;
* memoise visited (set, state) pairs — the same configuration reached by another order cannot succeed
  the second time (this is what makes it practical);
* equivalent ``info`` operations (same function and value) are interchangeable, so only the earliest
  pending one of each kind is a candidate (a symmetry reduction: k retries cost k states, not 2^k).

``fail`` operations are dropped (they definitely did not happen; the "no failed op visible" checker
covers them).  ``info`` operations may have happened at any time after their invocation or never: their
completion is +inf and the model offers both "took effect" and "did not" as next states.  Reads whose
outcome is unknown constrain nothing and are dropped.  Histories are split per key first
(P-compositionality: a history is linearizable iff each key's sub-history is), which keeps each search
small; the problem is NP-complete in general, so a state budget turns a hopeless search into ``unknown``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chaos.checkers.verdict import Verdict, failed, passed, unknown
from chaos.history import EventType, Operation

DEFAULT_MAX_STATES = 200_000


class Model(Protocol):
    """A sequential specification.  States must be hashable (they are memoised)."""

    name: str

    def init(self) -> Hashable: ...

    def step(self, state: Any, op: Operation) -> Sequence[Hashable]:
        """The states ``op`` can lead to from ``state`` given its observed result; empty = impossible."""
        ...

    def is_read(self, op: Operation) -> bool: ...


class RegisterModel:
    """A read/write/compare-and-set register (Knossos' ``cas-register``); the initial value is None.

    ``write`` value=v; ``read`` result=v; ``cas`` value=[old, new] (an ``ok`` cas swapped).
    """

    name = "register"

    def init(self) -> Hashable:
        return None

    def is_read(self, op: Operation) -> bool:
        return op.f == "read"

    def step(self, state: Any, op: Operation) -> Sequence[Hashable]:
        unknown_outcome = op.outcome is EventType.INFO
        if op.f == "write":
            return [op.value, state] if unknown_outcome else [op.value]
        if op.f == "read":
            return [state] if op.result == state else []
        if op.f == "cas":
            old, new = op.value
            if unknown_outcome:
                return [new, state] if state == old else [state]
            return [new] if state == old else []
        raise ValueError(f"register model: unknown operation {op.f!r} in {op.describe()}")


class TopicModel:
    """Whether a topic name exists, driven by create/delete outcomes and reads (set membership).

    ``create`` results: ``"created"`` (it did not exist) or ``"exists"`` (TOPIC_ALREADY_EXISTS);
    ``delete`` results: ``"deleted"`` or ``"not_found"`` (UNKNOWN_TOPIC_OR_PARTITION);
    ``read`` result: True/False (whether a list/describe showed the topic).

    ``check_rejections=False`` stops treating "exists"/"not_found" as observations, and
    ``check_reads=False`` ignores reads: both are answered from one controller's image without a quorum
    round trip, so like Kafka's they are not claimed linearizable (a deposed leader that has not noticed
    yet answers from a stale image).  Effective outcomes ("created"/"deleted") always count: they commit
    through Raft.
    """

    name = "topic"

    def __init__(self, check_rejections: bool = True, check_reads: bool = True) -> None:
        self.check_rejections = check_rejections
        self.check_reads = check_reads

    def init(self) -> Hashable:
        return False

    def is_read(self, op: Operation) -> bool:
        return op.f == "read"

    def step(self, state: Any, op: Operation) -> Sequence[Hashable]:
        exists = bool(state)
        if op.outcome is EventType.INFO:
            if op.f == "create":
                return [True] if exists else [True, False]
            if op.f == "delete":
                return [False, True] if exists else [False]
            return [exists]
        if op.f == "create":
            if op.result == "created":
                return [] if exists else [True]
            if op.result == "exists":
                return [True] if exists or not self.check_rejections else []
        elif op.f == "delete":
            if op.result == "deleted":
                return [False] if exists else []
            if op.result == "not_found":
                return [exists] if not exists or not self.check_rejections else []
        elif op.f == "read":
            return [exists] if bool(op.result) == exists or not self.check_reads else []
        raise ValueError(f"topic model: unexpected operation or result in {op.describe()}")


@dataclass(frozen=True, slots=True)
class KeyResult:
    key: str | None
    linearizable: bool | None  # None: the state budget ran out
    operations: int
    states_explored: int
    linearization: tuple[int, ...]  # op ids in linearization order (the longest prefix found on failure)
    stuck: tuple[Operation, ...]  # on failure: the candidates none of which could go next


def _relevant(ops: Sequence[Operation], model: Model) -> list[Operation]:
    kept = [
        op
        for op in ops
        if op.outcome is not EventType.FAIL and not (op.outcome is EventType.INFO and model.is_read(op))
    ]
    return sorted(kept, key=lambda op: (op.invoke_ns, op.op_id))


def check_key(
    ops: Sequence[Operation], model: Model, key: str | None = None, max_states: int = DEFAULT_MAX_STATES
) -> KeyResult:
    """Search for a linearization of one key's operations."""
    history = _relevant(ops, model)
    count = len(history)
    everything = (1 << count) - 1

    # Symmetry reduction: equivalent info operations (same f and value, unknown result, no deadline) can
    # swap places in any linearization, so only the earliest-invoked pending one of each class is tried.
    # Without this, k such operations on a key (e.g. retries while a node is down) cost 2^k states.
    info_class = [
        (history[i].f, repr(history[i].value)) if history[i].outcome is EventType.INFO else None
        for i in range(count)
    ]

    def candidates(mask: int) -> Iterator[int]:
        earliest_end = min((history[i].end_ns for i in range(count) if not mask >> i & 1), default=0.0)
        tried: set[tuple[str, str]] = set()
        for i in range(count):
            if history[i].invoke_ns > earliest_end:
                break  # sorted by invocation: everything later is too
            if mask >> i & 1:
                continue
            cls = info_class[i]
            if cls is not None:
                if cls in tried:
                    continue
                tried.add(cls)
            yield i

    def children(mask: int, state: Hashable) -> Iterator[tuple[int, Hashable, int]]:
        for i in candidates(mask):
            for next_state in model.step(state, history[i]):
                yield mask | 1 << i, next_state, i

    start = model.init()
    seen: set[tuple[int, Hashable]] = {(0, start)}
    stack: list[tuple[int, Hashable, Iterator[tuple[int, Hashable, int]]]] = [(0, start, children(0, start))]
    path: list[int] = []
    best_path: list[int] = []
    best_mask = 0
    explored = 1
    if count == 0:
        return KeyResult(key, True, 0, explored, (), ())
    while stack:
        _mask, _, branches = stack[-1]
        step = next(branches, None)
        if step is None:
            stack.pop()
            if path:
                path.pop()
            continue
        next_mask, next_state, index = step
        if next_mask == everything:
            order = tuple(history[i].op_id for i in [*path, index])
            return KeyResult(key, True, count, explored, order, ())
        if (next_mask, next_state) in seen:
            continue
        seen.add((next_mask, next_state))
        explored += 1
        if explored > max_states:
            return KeyResult(key, None, count, explored, tuple(history[i].op_id for i in best_path), ())
        path.append(index)
        if len(path) > len(best_path):
            best_path, best_mask = list(path), next_mask
        stack.append((next_mask, next_state, children(next_mask, next_state)))
    stuck = tuple(history[i] for i in candidates(best_mask))
    return KeyResult(key, False, count, explored, tuple(history[i].op_id for i in best_path), stuck)


def check_linearizable(
    ops: Sequence[Operation], model: Model, max_states_per_key: int = DEFAULT_MAX_STATES
) -> Verdict:
    """Check each key's sub-history; the verdict names the keys and operations that cannot linearize."""
    checker = f"linearizable-{model.name}"
    by_key: dict[str | None, list[Operation]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    results = [check_key(key_ops, model, key, max_states_per_key) for key, key_ops in by_key.items()]
    bad = [r for r in results if r.linearizable is False]
    undecided = [r for r in results if r.linearizable is None]
    details: dict[str, Any] = {
        "keys": len(results),
        "operations": sum(r.operations for r in results),
        "states_explored": sum(r.states_explored for r in results),
    }
    if bad:
        offending = [
            f"key {r.key!r}: after {len(r.linearization)} linearized ops none of "
            + ", ".join(op.describe() for op in r.stuck)
            + " can take effect"
            for r in bad
        ]
        details["non_linearizable_keys"] = [r.key for r in bad]
        return failed(
            checker, f"{len(bad)} of {len(results)} keys are not linearizable", offending, **details
        )
    if undecided:
        details["undecided_keys"] = [r.key for r in undecided]
        return unknown(checker, f"search budget exhausted on {len(undecided)} keys", **details)
    return passed(checker, f"all {len(results)} keys linearizable", **details)
