"""Leader-epoch truncation (KIP-101 / KIP-279): tables for the rules, properties over diverging logs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from replication_events import FIRST_FOUND
from replication_worlds import World, entries_of, worlds

from kraft.replication.epochs import (
    UNDEFINED,
    EpochEndOffset,
    EpochEntries,
    check_entries,
    diverging_epoch,
    end_offset_for_epoch,
    entries_truncated_to,
    with_leader_epoch,
)
from kraft.replication.truncation import (
    TruncationKind,
    TruncationStep,
    epoch_at,
    find_truncation,
    next_truncation_step,
    unclean_loss_allowed,
)

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- the leader's answer -----------------------------------------------------------------------------

ENTRIES = ((1, 0), (3, 10), (6, 25))


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (6, EpochEndOffset(6, 40)),  # the latest epoch ends at the log end
        (5, EpochEndOffset(3, 25)),  # unknown epoch: the largest below it, ending where 6 starts
        (3, EpochEndOffset(3, 25)),
        (2, EpochEndOffset(1, 10)),
        (1, EpochEndOffset(1, 10)),
        (0, EpochEndOffset(0, 0)),  # below the earliest: (requested, start of the earliest) — Kafka's rule
        (7, UNDEFINED),  # above the latest
        (-1, UNDEFINED),  # undefined request
    ],
)
def test_end_offset_for_epoch_follows_kafkas_leader_epoch_cache(
    requested: int, expected: EpochEndOffset
) -> None:
    assert end_offset_for_epoch(ENTRIES, 40, requested) == expected


def test_an_empty_log_answers_undefined() -> None:
    assert end_offset_for_epoch((), 0, 3) == UNDEFINED


def test_a_new_leader_records_its_epoch_at_its_log_end() -> None:
    assert with_leader_epoch(ENTRIES, 9, 40) == (*ENTRIES, (9, 40))
    assert with_leader_epoch(ENTRIES, 6, 40) == ENTRIES  # already recorded
    # an epoch recorded at the log end without records is replaced by the newer one
    assert with_leader_epoch(((1, 0), (4, 7)), 5, 7) == ((1, 0), (5, 7))
    assert with_leader_epoch((), 2, 0) == ((2, 0),)


def test_entries_truncated_to_drops_epochs_starting_at_or_after_the_offset() -> None:
    assert entries_truncated_to(ENTRIES, 25) == ((1, 0), (3, 10))
    assert entries_truncated_to(ENTRIES, 26) == ENTRIES
    assert entries_truncated_to(ENTRIES, 0) == ()


def test_check_entries_rejects_non_increasing_or_out_of_log_entries() -> None:
    check_entries(ENTRIES, 25)
    with pytest.raises(ValueError):
        check_entries(((1, 0), (1, 5)), 10)
    with pytest.raises(ValueError):
        check_entries(((1, 0), (2, 0)), 10)
    with pytest.raises(ValueError):
        check_entries(((1, 0), (2, 11)), 10)


# --- the follower's step -----------------------------------------------------------------------------


def test_same_epoch_truncates_to_the_smaller_end() -> None:
    # follower has more of epoch 3 than the leader
    step = next_truncation_step(((1, 0), (3, 10)), 30, 5, EpochEndOffset(3, 20))
    assert step == TruncationStep(TruncationKind.DONE, 20)


def test_epoch_unknown_to_the_follower_truncates_and_asks_again() -> None:
    # leader answers epoch 4, which the follower never had: truncate to the end of its epoch 3, ask for 3
    step = next_truncation_step(((1, 0), (3, 10), (5, 20)), 30, 0, EpochEndOffset(4, 25))
    assert step == TruncationStep(TruncationKind.ASK_AGAIN, 20, next_epoch=3)


def test_undefined_answer_falls_back_to_the_high_watermark() -> None:
    assert next_truncation_step(((1, 0),), 30, 12, UNDEFINED) == TruncationStep(TruncationKind.DONE, 12)


def test_a_follower_whose_whole_log_is_in_unknown_epochs_truncates_it_all() -> None:
    # follower [3,3], leader [1,1] then epoch 5: the follower's lookup of epoch 1 is below its earliest
    leader = with_leader_epoch(entries_of([1, 1]), 5, 2)
    step = find_truncation(entries_of([3, 3]), 2, 0, lambda e: end_offset_for_epoch(leader, 2, e))
    assert step == TruncationStep(TruncationKind.DONE, 0)


def test_truncation_below_the_high_watermark_is_refused() -> None:
    step = next_truncation_step(((1, 0), (3, 10)), 30, 21, EpochEndOffset(3, 20))
    assert step == TruncationStep(TruncationKind.BELOW_HIGH_WATERMARK, 20)


def test_an_unclean_election_allows_dropping_only_committed_records_older_than_its_epoch() -> None:
    entries = ((1, 0), (3, 10), (6, 25))  # offsets 0..9 epoch 1, 10..24 epoch 3, 25..29 epoch 6
    # committed up to 20 (HWM 21), truncating to 12 drops 12..20, all written in epoch 3
    assert unclean_loss_allowed(entries, 30, 21, 12, last_unclean_leader_epoch=4)
    assert not unclean_loss_allowed(entries, 30, 21, 12, last_unclean_leader_epoch=3)  # same epoch: a bug
    assert not unclean_loss_allowed(entries, 30, 21, 12, last_unclean_leader_epoch=0)  # no unclean election
    # a committed record of epoch 6 (HWM 27) is dropped: only an election after epoch 6 accepts that
    assert not unclean_loss_allowed(entries, 30, 27, 12, last_unclean_leader_epoch=4)
    assert unclean_loss_allowed(entries, 30, 27, 12, last_unclean_leader_epoch=7)
    assert unclean_loss_allowed(entries, 30, 21, 21, last_unclean_leader_epoch=0)  # nothing committed goes
    assert not unclean_loss_allowed((), 5, 5, 0, last_unclean_leader_epoch=9)  # no epochs known: refused
    assert [epoch_at(entries, o) for o in (0, 9, 10, 24, 25, 29)] == [1, 1, 3, 3, 6, 6]
    assert epoch_at(((2, 5),), 4) == -1


def test_an_empty_follower_has_nothing_to_truncate() -> None:
    assert find_truncation((), 0, 0, lambda e: UNDEFINED) == TruncationStep(TruncationKind.DONE, 0)


# --- properties over generated diverging logs ----------------------------------------------------------

TruncationFinder = Callable[[EpochEntries, int, int, Callable[[int], EpochEndOffset]], TruncationStep]


def _truncate(world: World, finder: TruncationFinder = find_truncation) -> TruncationStep:
    leader_entries, leader_end = world.leader_entries, len(world.leader_log)
    return finder(
        world.follower_entries,
        len(world.follower_log),
        world.follower_high_watermark,
        lambda epoch: end_offset_for_epoch(leader_entries, leader_end, epoch),
    )


def _truncates_exactly_at_the_divergence(world: World, finder: TruncationFinder = find_truncation) -> bool:
    step = _truncate(world, finder)
    kept = world.follower_log[: step.offset]
    return (
        step.kind is TruncationKind.DONE
        and kept == world.leader_log[: len(kept)]  # what is left is a prefix of the leader's log
        and step.offset == world.divergence  # and nothing common was removed
    )


@PROPERTY
@given(worlds())
def test_after_truncation_the_follower_is_a_prefix_of_the_leader_cut_exactly_at_the_divergence(
    world: World,
) -> None:
    step = _truncate(world)
    assert step.kind is TruncationKind.DONE, world
    assert world.follower_log[: step.offset] == world.leader_log[: step.offset], world
    assert step.offset == world.divergence, world


@PROPERTY
@given(worlds())
def test_with_clean_elections_truncation_never_goes_below_the_high_watermark(world: World) -> None:
    step = _truncate(world)
    assert step.offset >= world.follower_high_watermark


@PROPERTY
@given(worlds(consistent_high_watermark=False))
def test_truncation_is_refused_exactly_when_it_would_remove_committed_records(world: World) -> None:
    step = _truncate(world)
    if world.divergence < world.follower_high_watermark:
        assert step.kind is TruncationKind.BELOW_HIGH_WATERMARK
        assert step.offset < world.follower_high_watermark
    else:
        assert step == TruncationStep(TruncationKind.DONE, world.divergence)


@PROPERTY
@given(worlds(consistent_high_watermark=False), st.integers(0, 20))
def test_an_unclean_election_accepts_exactly_the_loss_of_records_written_before_it(
    world: World, unclean_epoch: int
) -> None:
    """Each refused step is allowed exactly when every committed record it drops (the follower's log
    holds each record's epoch) was written in an epoch older than the unclean election's."""
    step = _truncate(world)
    if step.kind is not TruncationKind.BELOW_HIGH_WATERMARK:
        return
    end = len(world.follower_log)
    dropped = world.follower_log[step.offset : min(world.follower_high_watermark, end)]
    allowed = unclean_loss_allowed(
        world.follower_entries, end, world.follower_high_watermark, step.offset, unclean_epoch
    )
    assert dropped and allowed == all(epoch < unclean_epoch for epoch in dropped), world


@PROPERTY
@given(worlds())
def test_intermediate_steps_never_cut_below_the_divergence(world: World) -> None:
    entries, log_end = world.follower_entries, len(world.follower_log)
    leader_entries, leader_end = world.leader_entries, len(world.leader_log)
    epoch = entries[-1][0] if entries else -1
    while epoch != -1:
        step = next_truncation_step(
            entries, log_end, 0, end_offset_for_epoch(leader_entries, leader_end, epoch)
        )
        assert step.offset >= world.divergence
        if step.kind is not TruncationKind.ASK_AGAIN:
            break
        assert step.next_epoch < epoch  # the conversation ends
        entries, log_end, epoch = entries_truncated_to(entries, step.offset), step.offset, step.next_epoch


@PROPERTY
@given(worlds())
def test_fetch_divergence_check_flags_exactly_the_followers_that_diverged(world: World) -> None:
    if not world.follower_log:
        return  # an empty follower sends no last fetched epoch
    answer = diverging_epoch(
        world.leader_entries, len(world.leader_log), len(world.follower_log), world.follower_log[-1]
    )
    is_prefix = world.follower_log == world.leader_log[: len(world.follower_log)]
    assert (answer is None) == is_prefix
    if answer is not None:
        # the DivergingEpoch answer drives the same follower step as OffsetsForLeaderEpoch
        step = next_truncation_step(world.follower_entries, len(world.follower_log), 0, answer)
        assert step.offset >= world.divergence


@PROPERTY
@given(worlds())
def test_generated_entries_are_well_formed(world: World) -> None:
    check_entries(world.follower_entries, len(world.follower_log))
    check_entries(world.leader_entries, len(world.leader_log))


# --- the properties catch broken implementations -------------------------------------------------------


def _without_kip_279(
    entries: EpochEntries, log_end: int, high_watermark: int, ask: Callable[[int], EpochEndOffset]
) -> TruncationStep:
    """KIP-101 without KIP-279: one question, truncate to min(leader's end, log end), never ask again."""
    latest = entries[-1][0] if entries else -1
    answer = ask(latest)
    if answer.is_undefined:
        return TruncationStep(TruncationKind.DONE, min(high_watermark, log_end))
    return TruncationStep(TruncationKind.DONE, min(answer.end_offset, log_end))


def _to_high_watermark(
    entries: EpochEntries, log_end: int, high_watermark: int, ask: Callable[[int], EpochEndOffset]
) -> TruncationStep:
    """Pre-KIP-101: truncate to the high watermark."""
    return TruncationStep(TruncationKind.DONE, high_watermark)


def _ignoring_the_followers_own_end(
    entries: EpochEntries, log_end: int, high_watermark: int, ask: Callable[[int], EpochEndOffset]
) -> TruncationStep:
    """Trusts the leader's end offset even when the follower has less of that epoch."""
    step = find_truncation(entries, log_end, high_watermark, ask)
    answer = ask(entries[-1][0]) if entries else UNDEFINED
    return TruncationStep(step.kind, max(step.offset, min(answer.end_offset, log_end)))


@pytest.mark.parametrize("broken", [_without_kip_279, _to_high_watermark, _ignoring_the_followers_own_end])
def test_the_truncation_property_catches_a_broken_rule(broken: TruncationFinder) -> None:
    counterexample = find(
        worlds(),
        lambda world: not _truncates_exactly_at_the_divergence(world, broken),
        settings=settings(
            max_examples=2000, database=None, deadline=None, derandomize=True, phases=FIRST_FOUND
        ),
    )
    assert not _truncates_exactly_at_the_divergence(counterexample, broken)


def test_the_correct_rule_has_no_counterexample() -> None:
    with pytest.raises(NoSuchExample):
        find(
            worlds(),
            lambda world: not _truncates_exactly_at_the_divergence(world),
            settings=settings(max_examples=500, database=None, deadline=None, derandomize=True),
        )
