"""PersistentMap.changes_since_steps: the same answer as a dict model gives, in bounded steps, for
related versions, unrelated maps and a plain-dict ``previous`` (the image store's save after a snapshot
load compares two maps that share nothing)."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata.pmap import COMPARE_STEP, PersistentMap


def _run(steps: Generator[None, None, Any]) -> tuple[Any, int]:
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, pauses
        pauses += 1


def _expected(
    new: Mapping[int, object], old: Mapping[int, object]
) -> tuple[list[int], list[tuple[int, object]]]:
    return [k for k in old if k not in new], [(k, v) for k, v in new.items() if old.get(k) is not v]


@settings(max_examples=60)
@given(
    st.integers(min_value=0, max_value=3 * COMPARE_STEP),
    st.sets(st.integers(min_value=0, max_value=3 * COMPARE_STEP), max_size=50),
    st.booleans(),
)
def test_steps_give_the_one_go_answer(size: int, touched: set[int], as_dict: bool) -> None:
    values = [object() for _ in range(size)]
    old = PersistentMap((i, values[i]) for i in range(size))
    related = old.with_changes([k for k in touched if k % 2], [(k, object()) for k in touched if not k % 2])
    unrelated = PersistentMap((i, object()) for i in range(0, size, 2))
    previous: Mapping[int, object] = dict(old) if as_dict else old
    for new in (related, unrelated):
        (removed, updated), pauses = _run(new.changes_since_steps(previous))
        assert (removed, updated) == _expected(new, previous)
        assert (removed, updated) == new.changes_since(previous)
        # unrelated maps are compared in full, so in steps of COMPARE_STEP
        if new is unrelated:
            assert pauses >= (size // COMPARE_STEP) - 1
