"""Quorum arithmetic and the transition table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kraft.raft.quorum import (
    election_backoff_ms,
    end_quorum_backoff_ms,
    is_log_up_to_date,
    majority,
    majority_offset,
    random_election_timeout_ms,
)
from kraft.raft.state import ALLOWED_TRANSITIONS, InvalidTransitionError, StateKind, check_transition


def naive_majority_offset(offsets: list[int]) -> int:
    """The largest x that at least a majority of the offsets reach."""
    return max(x for x in offsets if sum(1 for o in offsets if o >= x) >= majority(len(offsets)))


@given(st.lists(st.integers(min_value=-1, max_value=1_000), min_size=1, max_size=9))
def test_majority_offset_matches_the_naive_definition(offsets: list[int]) -> None:
    assert majority_offset(offsets) == naive_majority_offset(offsets)


@given(st.integers(0, 5), st.integers(0, 100), st.integers(0, 5), st.integers(0, 100))
def test_up_to_date_compares_epoch_first_then_offset(
    a_epoch: int, a_end: int, b_epoch: int, b_end: int
) -> None:
    expected = (a_epoch, a_end) >= (b_epoch, b_end)
    assert is_log_up_to_date(a_epoch, a_end, b_epoch, b_end) is expected


class _Rng:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize("value", [0.0, 0.5, 0.999])
def test_election_timeout_is_in_t_to_2t(value: float) -> None:
    assert 1000 <= random_election_timeout_ms(1000, _Rng(value)) < 2000


def test_election_backoff_grows_and_is_capped() -> None:
    assert election_backoff_ms(0, 100, 1000, _Rng(0.9)) == 90
    assert election_backoff_ms(3, 100, 1000, _Rng(0.9)) == 720
    assert election_backoff_ms(10, 100, 1000, _Rng(0.9)) == 1000


def test_end_quorum_epoch_backoff_by_position_among_preferred_successors() -> None:
    successors = (3, 2, 5)
    assert end_quorum_backoff_ms(3, successors, 1000) == 0
    assert end_quorum_backoff_ms(2, successors, 1000) == 250  # (1000 >> 2) << 0
    assert end_quorum_backoff_ms(5, successors, 1000) == 500  # (1000 >> 2) << 1
    assert end_quorum_backoff_ms(7, successors, 1000) == 1000  # not a preferred successor


def test_only_a_prospective_node_becomes_candidate_and_only_a_candidate_leader() -> None:
    assert {s for s, targets in ALLOWED_TRANSITIONS.items() if StateKind.CANDIDATE in targets} == {
        StateKind.PROSPECTIVE
    }
    assert {s for s, targets in ALLOWED_TRANSITIONS.items() if StateKind.LEADER in targets} == {
        StateKind.CANDIDATE
    }
    with pytest.raises(InvalidTransitionError):
        check_transition(StateKind.LEADER, StateKind.CANDIDATE, is_voter=True)


def test_observers_only_move_between_unattached_and_follower() -> None:
    check_transition(StateKind.UNATTACHED, StateKind.FOLLOWER, is_voter=False)
    with pytest.raises(InvalidTransitionError):
        check_transition(StateKind.UNATTACHED, StateKind.PROSPECTIVE, is_voter=False)
