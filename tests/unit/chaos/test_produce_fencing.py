"""Fenced periods derived from the monitor's samples."""

from __future__ import annotations

from chaos_histories import op

from chaos.checkers import ClusterSample, FencingInterval, Status, check_fenced_broker_never_acked
from chaos.produce import fencing_intervals


def test_intervals_span_first_to_last_fenced_sample_per_broker() -> None:
    samples = [
        ClusterSample(1, 1, {101: False, 102: False}),
        ClusterSample(2, 1, {101: True, 102: False}),
        ClusterSample(3, None, {}),  # no active controller: says nothing about brokers
        ClusterSample(4, 2, {101: True, 102: True}),
        ClusterSample(5, 2, {101: False, 102: True}),
    ]
    assert sorted(fencing_intervals(samples), key=lambda i: i.broker_id) == [
        FencingInterval(101, 2, 4),
        FencingInterval(102, 4, 5),  # still fenced at the end of the samples
    ]


def test_no_fencing_no_intervals() -> None:
    assert fencing_intervals([ClusterSample(1, 1, {101: False})]) == []


# --- one fence at a time: the committed log's registration records split the samples (kill/12) ---

BROKER = 101
PRODUCER = 7
# Committed records about broker 101: registered at 3, unfenced at 4, fenced at 48 (session expired),
# unfenced at 55, fenced again at 65 (the next leader), unfenced at 71.
REGISTRATIONS = {BROKER: [3, 4, 48, 55, 65, 71]}


def _kill12_samples() -> list[ClusterSample]:
    return [
        ClusterSample(10, 1, {BROKER: True}, metadata_offset=50, probe_ns=9),
        # leader 1 unfences the broker at offset 55 and is killed; no sample sees it
        ClusterSample(20, None, {}),
        ClusterSample(30, 2, {BROKER: True}, metadata_offset=66, probe_ns=29),
        ClusterSample(36, 2, {BROKER: True}, metadata_offset=68, probe_ns=35),
        ClusterSample(40, 2, {BROKER: False}, metadata_offset=72, probe_ns=39),
    ]


def test_fenced_samples_of_two_different_fences_are_not_merged() -> None:
    intervals = fencing_intervals(_kill12_samples(), REGISTRATIONS)
    # An interval ends when the last sample of that same fence was *sent* (still fenced by then); the
    # first fence was seen by one sample only, which proves no period at all.
    assert intervals == [FencingInterval(BROKER, 30, 35)]


def test_acks_while_an_unseen_unfence_was_in_force_are_not_blamed() -> None:
    """The false alarm of kill/12: acks between two fences looked like acks during one long fence."""
    legit = [op("produce", 12 + i, 13 + i, process=PRODUCER, key="p-0") for i in range(0, 12, 2)]
    during = op("produce", 31, 33, process=PRODUCER, key="p-0")  # the second fence is proven in force
    brokers = {PRODUCER: BROKER}
    # The merged (old) view blames every legitimate ack between the two fences.
    merged = check_fenced_broker_never_acked(legit, fencing_intervals(_kill12_samples()), brokers)
    assert merged.status is Status.FAIL and len(merged.offending) == len(legit)
    split = fencing_intervals(_kill12_samples(), REGISTRATIONS)
    assert check_fenced_broker_never_acked(legit, split, brokers).ok
    verdict = check_fenced_broker_never_acked([*legit, during], split, brokers)
    assert verdict.status is Status.FAIL and verdict.offending == (
        f"{during.describe()}: broker {BROKER} fenced since t=30",
    )


def test_an_ack_inside_the_last_probe_round_trip_is_not_blamed() -> None:
    samples = [
        ClusterSample(10, 1, {BROKER: True}, metadata_offset=50, probe_ns=9),
        ClusterSample(20, 1, {BROKER: True}, metadata_offset=50, probe_ns=15),
        ClusterSample(30, 1, {BROKER: False}, metadata_offset=56, probe_ns=25),
    ]
    intervals = fencing_intervals(samples, REGISTRATIONS)
    assert intervals == [FencingInterval(BROKER, 10, 15)]
    # Completed at 17: after the last fenced probe was sent but before its answer; the unfence may
    # have committed in between, so it is not blamed.  One completed at 14 is.
    brokers = {PRODUCER: BROKER}
    assert check_fenced_broker_never_acked([op("produce", 12, 17, process=PRODUCER)], intervals, brokers).ok
    blamed = check_fenced_broker_never_acked([op("produce", 11, 14, process=PRODUCER)], intervals, brokers)
    assert blamed.status is Status.FAIL


def test_stale_views_and_unknown_offsets_say_nothing() -> None:
    samples = [
        ClusterSample(10, 1, {BROKER: True}, metadata_offset=50, probe_ns=9),
        ClusterSample(20, 2, {BROKER: False}, metadata_offset=56, probe_ns=19),
        # a deposed controller still answering from an older image: not evidence of anything
        ClusterSample(30, 1, {BROKER: True}, metadata_offset=50, probe_ns=29),
        ClusterSample(34, 1, {BROKER: True}, metadata_offset=50, probe_ns=33),
        ClusterSample(40, 2, {BROKER: True}, metadata_offset=-1, probe_ns=39),
        ClusterSample(44, 2, {BROKER: True}, metadata_offset=-1, probe_ns=43),
    ]
    assert fencing_intervals(samples, REGISTRATIONS) == []
    # Without the log the same samples look like a fence from 30 to 43.
    assert fencing_intervals(samples) == [FencingInterval(BROKER, 30, 43)]
