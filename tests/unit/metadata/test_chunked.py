"""ChunkedSequence (and the compact form images keep: a tuple up to one chunk) against a plain list: the
same items after any mix of updates and appends, every older version unchanged, untouched chunks shared,
and the tuple-like reads (index, slice, iteration, equality, hash) the image's users rely on.  Chunks of
4 here (module fixture), so a few dozen items cross many chunk boundaries; test_chunked_topics.py covers
topics at the real chunk size."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import chunked
from kraft.metadata.chunked import ChunkedSequence, Compact, chunks_of, compact, with_changes

SMALL_SHIFT = 2  # chunks of 4


@pytest.fixture(autouse=True, scope="module")
def _small_chunks() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunked, "SHIFT", SMALL_SHIFT)
        patch.setattr(chunked, "CHUNK", 1 << SMALL_SHIFT)
        patch.setattr(chunked, "_MASK", (1 << SMALL_SHIFT) - 1)
        yield


def check_equal(seq: ChunkedSequence[int], model: list[int]) -> None:
    """Every read a caller uses gives what the list gives."""
    n = len(model)
    assert len(seq) == n and bool(seq) == bool(model)
    assert list(seq) == model
    assert list(reversed(seq)) == model[::-1]
    assert [seq[i] for i in range(n)] == model
    assert [seq[i] for i in range(-n, 0)] == model
    for bad in (n, n + 1, n + 5, -n - 1):
        with pytest.raises(IndexError):
            seq[bad]
    assert seq == tuple(model) and tuple(model) == seq
    assert not seq != tuple(model)  # noqa: SIM202 (__ne__ itself)
    assert hash(seq) == hash(tuple(model))
    assert seq == ChunkedSequence(model)  # built at once equals built by updates
    for start in (0, 1, 3, 4, 5, n // 2, n - 1, n, n + 3):
        assert list(seq.iter_from(start)) == model[max(0, start) :]
        assert seq[start:] == tuple(model[start:])
        assert seq[start : start + 5] == tuple(model[start : start + 5])
    assert seq[::2] == tuple(model[::2]) and seq[::-1] == tuple(model[::-1]) and seq[-3:] == tuple(model[-3:])
    for value in set(model[:3]) | {-1}:
        assert (value in seq) == (value in model)
    chunks = seq.chunks()
    assert all(len(c) == chunked.CHUNK for c in chunks[:-1]) and (not chunks or len(chunks[-1]) >= 1)


# One step: updates of existing positions (by index into the current list) and a number of appends.
STEPS = st.lists(
    st.tuples(st.lists(st.tuples(st.integers(0, 10**6), st.integers()), max_size=8), st.integers(0, 11)),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(), max_size=30), STEPS)
def test_equals_a_list_under_random_updates_and_appends_and_old_versions_never_change(
    initial: list[int], steps: list[tuple[list[tuple[int, int]], int]]
) -> None:
    seq = ChunkedSequence(initial)
    model = list(initial)
    versions = [(seq, list(model))]
    check_equal(seq, model)
    counter = 10**9  # appended values differ from every drawn one
    for updates, appends in steps:
        changes: dict[int, int] = {}
        if model:
            for where, value in updates:
                changes[where % len(model)] = value
        added = list(range(counter, counter + appends))
        counter += appends
        # appended positions in a shuffled order sometimes: replay order is not required to be sorted
        order = list(range(len(model), len(model) + appends))
        if appends > 1 and len(updates) % 2:
            order.reverse()
        for position in order:
            changes[position] = added[position - len(model)]
        before_chunks = seq.chunks()
        new = seq.updated(changes, len(model) + appends)
        for position, value in changes.items():
            if position < len(model):
                model[position] = value
        model.extend(added)
        check_equal(new, model)
        # untouched chunks are the very same objects
        touched = {position >> chunked.SHIFT for position in changes}
        for c, chunk in enumerate(before_chunks):
            if c not in touched:
                assert new.chunks()[c] is chunk
        if not changes:
            assert new is seq
        seq = new
        versions.append((seq, list(model)))
    for version, snapshot in versions:
        check_equal(version, snapshot)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(), min_size=1, max_size=30), st.data())
def test_a_refused_update_leaves_the_sequence_as_it_was(initial: list[int], data: st.DataObject) -> None:
    seq = ChunkedSequence(initial)
    n = len(initial)
    bad = data.draw(
        st.sampled_from(
            [
                ({n + 1: 7}, n + 2),  # a hole at n
                ({n: 7}, n + 2),  # n + 1 missing
                ({0: 7}, n - 1),  # shrinking
                ({n + 3: 7}, n),  # past the length
                ({-1: 7}, n),  # negative position
                ({0: 7, n + 5: 8}, n + 1),  # past the length, with n missing: counts alone would balance
            ]
        )
    )
    changes, length = bad
    with pytest.raises((IndexError, ValueError)):
        seq.updated(changes, length)
    check_equal(seq, initial)


def test_default_length_covers_the_changes() -> None:
    seq = ChunkedSequence([1, 2, 3])
    assert list(seq.updated({3: 4, 4: 5})) == [1, 2, 3, 4, 5]
    assert list(seq.updated({0: 9})) == [9, 2, 3]
    assert list(ChunkedSequence[int]().updated({0: 1})) == [1]


def test_equality_and_comparison_with_other_types() -> None:
    seq = ChunkedSequence(range(10))
    assert seq != list(range(10))  # like a tuple: a list is not equal
    assert seq != tuple(range(9)) and seq != ChunkedSequence(range(11))
    assert seq != ChunkedSequence([*range(9), 99])
    assert ChunkedSequence[int]() == () and not ChunkedSequence[int]()
    with pytest.raises(TypeError):
        seq["x"]  # type: ignore[call-overload]


def test_pickles_to_an_equal_sequence() -> None:
    seq = ChunkedSequence(range(13)).updated({2: 99, 13: 100})
    copy = pickle.loads(pickle.dumps(seq))
    assert copy == seq and list(copy) == list(seq)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(), max_size=10), STEPS)
def test_compact_sequences_are_tuples_up_to_a_chunk_and_follow_a_list(
    initial: list[int], steps: list[tuple[list[tuple[int, int]], int]]
) -> None:
    seq: Compact[int] = compact(initial)
    model = list(initial)
    versions = [(seq, list(model))]
    counter = 10**9
    for updates, appends in steps:
        changes = {where % len(model): value for where, value in updates} if model else {}
        changes.update({len(model) + i: counter + i for i in range(appends)})
        counter += appends
        before_chunks = chunks_of(seq)
        new = with_changes(seq, changes, len(model) + appends)
        for position, value in changes.items():
            if position < len(model):
                model[position] = value
        model.extend(sorted(v for p, v in changes.items() if p >= len(model)))
        assert isinstance(new, tuple) == (len(model) <= chunked.CHUNK)
        assert list(new) == model and new == tuple(model) and len(new) == len(model)
        assert [new[i] for i in range(len(model))] == model
        if isinstance(new, ChunkedSequence):
            check_equal(new, model)
            touched = {position >> chunked.SHIFT for position in changes}
            for c, chunk in enumerate(before_chunks):
                if c not in touched and isinstance(seq, ChunkedSequence):
                    assert chunks_of(new)[c] is chunk
        seq = new
        versions.append((seq, list(model)))
    for version, snapshot in versions:
        assert list(version) == snapshot


def test_compact_shares_what_it_is_given() -> None:
    small = (1, 2, 3)
    assert compact(small) is small
    big = ChunkedSequence(range(10))
    assert compact(big) is big
    one_chunk = ChunkedSequence(range(3))
    assert compact(one_chunk) == (0, 1, 2) and isinstance(compact(one_chunk), tuple)
    assert compact(iter(range(10))) == big and isinstance(compact(range(10)), ChunkedSequence)
    assert compact([]) == () and chunks_of(()) == () and chunks_of(small) == (small,)
    # a tuple longer than a chunk (not compact) is chunked before the update
    assert with_changes(tuple(range(9)), {9: 9}) == tuple(range(10))
