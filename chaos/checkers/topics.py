"""Set-style checks of topic create/delete outcomes against what the cluster showed.

Polynomial-time companions of the linearizability checker (Jepsen's set checker): an acknowledged
operation must not be lost, and a failed one must never become visible.  Operations use the
``TopicModel`` vocabulary: ``f`` is ``create``/``delete``, ``key`` the topic name.

An *observation* is a read of the whole topic set at one time (a ``topic list`` answered by the active
controller, or a broker's image); the final observation after healing is the one that matters most.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chaos.checkers.verdict import Verdict, failed, passed
from chaos.history import EventType, Operation


@dataclass(frozen=True, slots=True)
class TopicObservation:
    """The set of topic names some reader saw at ``time_ns`` (same clock as the history)."""

    source: str
    time_ns: int
    topics: frozenset[str]


def _by_key(ops: Iterable[Operation]) -> dict[str, list[Operation]]:
    grouped: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.key is not None and op.f in ("create", "delete"):
            grouped[op.key].append(op)
    return grouped


def _may_follow(later: Operation, earlier: Operation) -> bool:
    """Could ``later`` take effect after ``earlier`` did?  Not if it completed before ``earlier`` began."""
    return later.outcome is not EventType.FAIL and later.end_ns > earlier.invoke_ns


def check_no_lost_acknowledged(ops: Sequence[Operation], final: TopicObservation) -> Verdict:
    """Every acknowledged create/delete must be reflected in the final state unless a later op undoes it."""
    checker = "no-lost-acknowledged"
    lost: list[str] = []
    checked = 0
    for key, key_ops in _by_key(ops).items():
        for op in key_ops:
            if op.outcome is not EventType.OK:
                continue
            checked += 1
            undo = "delete" if op.f == "create" else "create"
            undone = any(other.f == undo and _may_follow(other, op) for other in key_ops)
            present = key in final.topics
            expected_present = op.f == "create"
            if not undone and present != expected_present:
                state = "missing" if expected_present else "still present"
                lost.append(f"{op.describe()}: topic {state} in {final.source} at the end")
    if lost:
        return failed(checker, f"{len(lost)} acknowledged operations lost", lost, checked=checked)
    return passed(checker, f"all {checked} acknowledged operations survive", checked=checked)


def check_no_failed_visible(ops: Sequence[Operation], observations: Sequence[TopicObservation]) -> Verdict:
    """A failed create must never show its topic, unless another create of it might have succeeded;
    a failed delete must never hide a topic that an acknowledged create made, unless another delete might
    have succeeded."""
    checker = "no-failed-visible"
    grouped = _by_key(ops)
    visible: list[str] = []
    for key, key_ops in grouped.items():
        creators = [op for op in key_ops if op.f == "create" and op.outcome is not EventType.FAIL]
        deleters = [op for op in key_ops if op.f == "delete" and op.outcome is not EventType.FAIL]
        for op in key_ops:
            if op.outcome is not EventType.FAIL:
                continue
            for seen in observations:
                if op.f == "create" and key in seen.topics:
                    # Explained if some non-failed create was invoked before the observation.
                    if not any(c.invoke_ns <= seen.time_ns for c in creators):
                        visible.append(f"{op.describe()}: topic visible in {seen.source} at t={seen.time_ns}")
                        break
                elif op.f == "delete" and key not in seen.topics:
                    made = [c for c in creators if c.outcome is EventType.OK and c.end_ns <= seen.time_ns]
                    explained = any(d.invoke_ns <= seen.time_ns for d in deleters)
                    if made and not explained and op.invoke_ns <= seen.time_ns:
                        visible.append(f"{op.describe()}: topic gone in {seen.source} at t={seen.time_ns}")
                        break
    failed_ops = sum(1 for key_ops in grouped.values() for op in key_ops if op.outcome is EventType.FAIL)
    if visible:
        return failed(
            checker, f"{len(visible)} failed operations took effect", visible, failed_ops=failed_ops
        )
    return passed(checker, f"none of {failed_ops} failed operations took effect", failed_ops=failed_ops)
