"""bench.encoded_writes: each phase writes the records it is named for (a big topic in slices inside its
transaction, the small CreateTopics, CreatePartitions' new partitions), so its µs per record divides by what
the append takes."""

from __future__ import annotations

import argparse

from bench.encoded_writes import one_round


def test_each_phase_counts_the_records_it_appends() -> None:
    args = argparse.Namespace(
        brokers=12,
        big=2_500,
        small_requests=2,
        small_partitions=4,
        grow_topics=2,
        grow_to=9,
        sole=0,
        pairs=0,
        work_unit=1000,
        led=0,
        no_creates=False,
    )
    result = one_round(args)
    assert result["big_topic_records"] == 2_500 + 3  # BeginTransaction, TopicRecord, EndTransaction
    assert result["small_creates_records"] == 2 * 10 * (1 + 4)  # a TopicRecord and 4 partitions each
    assert result["grow_records"] == 2 * (9 - 4)
    assert all(result[f"{phase}_ms"] > 0 for phase in ("big_topic", "small_creates", "grow"))
    assert "fence_sole_ms" not in result


def test_the_fence_phases_count_the_changes_they_append() -> None:
    """Session 19: each fence and unfence writes its broker's registration change and one change per
    partition it is named for (a sole replica's leave, its election back, an ISR dropping below min ISR)."""
    args = argparse.Namespace(
        brokers=12,
        big=10,
        small_requests=1,
        small_partitions=1,
        grow_topics=1,
        grow_to=2,
        sole=20,
        pairs=30,
        work_unit=1000,
        led=0,
        no_creates=False,
    )
    result = one_round(args)
    assert result["fence_sole_records"] == 1 + 20
    assert result["unfence_sole_records"] == 1 + 20
    assert result["fence_pairs_records"] == 1 + 30


def test_the_led_phases_count_what_they_append() -> None:
    """Session 20: broker 1 fenced leaves each ISR of the partitions it led (one change each, the next
    replica leading), and its unfence writes only its registration change — an election cannot give it
    a partition back (it is out of every ISR) — with slices of ``work_unit`` records."""
    args = argparse.Namespace(
        brokers=12,
        big=0,
        small_requests=0,
        small_partitions=0,
        grow_topics=0,
        grow_to=0,
        sole=0,
        pairs=0,
        work_unit=7,
        led=1_030,
        no_creates=True,
    )
    result = one_round(args)
    assert result["fence_led_records"] == 1 + 1_030
    assert result["unfence_led_records"] == 1
    assert "big_topic_ms" not in result and "fence_sole_ms" not in result
