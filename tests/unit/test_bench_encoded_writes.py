"""bench.encoded_writes: each phase writes the records it is named for (a big topic in slices inside its
transaction, the small CreateTopics, CreatePartitions' new partitions), so its µs per record divides by what
the append takes."""

from __future__ import annotations

import argparse

from bench.encoded_writes import one_round


def test_each_phase_counts_the_records_it_appends() -> None:
    args = argparse.Namespace(
        brokers=12, big=2_500, small_requests=2, small_partitions=4, grow_topics=2, grow_to=9
    )
    result = one_round(args)
    assert result["big_topic_records"] == 2_500 + 3  # BeginTransaction, TopicRecord, EndTransaction
    assert result["small_creates_records"] == 2 * 10 * (1 + 4)  # a TopicRecord and 4 partitions each
    assert result["grow_records"] == 2 * (9 - 4)
    assert all(result[f"{phase}_ms"] > 0 for phase in ("big_topic", "small_creates", "grow"))
