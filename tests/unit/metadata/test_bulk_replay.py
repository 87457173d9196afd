"""The bulk snapshot path (``decode_values`` + ``MetadataDelta.replay_values``) against record-by-record
replay, and the image store round trip, on generated record sequences (hypothesis)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.metadata.commit_replay import REPLAY_SLICE_RECORDS, replay_batch
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_records import image_records, image_values
from kraft.metadata.store import SqliteImageStore
from kraft.raft.api import CommittedBatch, CommittedRecord, offset_values
from kraft.raft.listeners import LazyRecords
from kraft.storage.batch import build_batch
from kraft.v1 import metadata_pb2 as pb

BROKERS = st.integers(min_value=1, max_value=5)
TOPIC_IDS = st.sampled_from(["T0", "T1", "T2", "missing"])
ID_LISTS = st.lists(BROKERS, min_size=0, max_size=4)


def _topic(topic_id: str) -> pb.TopicRecord:
    return pb.TopicRecord(name=f"name-{topic_id}", topic_id=topic_id)


def _partition(
    topic_id: str, partition_id: int, replicas: list[int], isr: list[int] | None, leader: int
) -> pb.PartitionRecord:
    return pb.PartitionRecord(
        topic_id=topic_id,
        partition_id=partition_id,
        replicas=replicas,
        isr=replicas if isr is None else isr,  # equal lists are the common case: the image shares them
        leader=leader,
        leader_epoch=partition_id % 3,
        partition_epoch=partition_id % 2,
    )


def _change(
    topic_id: str, partition_id: int, leader: int | None, isr: list[int] | None, replicas: list[int] | None
) -> pb.PartitionChangeRecord:
    record = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=partition_id)
    if leader is not None:
        record.leader = leader
    if isr is not None:
        record.isr.ids.extend(isr)
    if replicas is not None:
        record.replicas.ids.extend(replicas)
    return record


PAYLOADS: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        lambda b, e, f: pb.RegisterBrokerRecord(
            broker_id=b, broker_epoch=e, incarnation_id=f"i{b}", fenced=f
        ),
        BROKERS,
        st.integers(0, 3),
        st.booleans(),
    ),
    st.builds(lambda b, e: pb.FenceBrokerRecord(id=b, epoch=e), BROKERS, st.integers(0, 3)),
    st.builds(lambda b, e: pb.UnfenceBrokerRecord(id=b, epoch=e), BROKERS, st.integers(0, 3)),
    st.builds(
        lambda b, e: pb.UnregisterBrokerRecord(broker_id=b, broker_epoch=e), BROKERS, st.integers(0, 3)
    ),
    st.builds(_topic, TOPIC_IDS),
    st.builds(
        _partition, TOPIC_IDS, st.integers(0, 4), ID_LISTS, st.none() | ID_LISTS, BROKERS | st.just(-1)
    ),
    st.builds(
        _change, TOPIC_IDS, st.integers(0, 4), st.none() | BROKERS, st.none() | ID_LISTS, st.none() | ID_LISTS
    ),
    st.builds(lambda t: pb.RemoveTopicRecord(topic_id=t), TOPIC_IDS),
    st.builds(
        lambda t, v: pb.ConfigRecord(
            resource_type=2, resource_name=f"name-{t}", name="retention.ms", value=v
        ),
        TOPIC_IDS,
        st.sampled_from(["1", "2"]),
    ),
    st.builds(
        lambda lvl: pb.FeatureLevelRecord(name="metadata.version", feature_level=lvl), st.integers(0, 3)
    ),
    st.just(pb.NoOpRecord()),
)


def _one_by_one(base: MetadataImage, values: list[bytes], offset: int) -> MetadataDelta:
    delta = MetadataDelta(base)
    for value in values:
        delta.replay(records.decode_value(value), offset, 7)
    return delta


def _bulk(base: MetadataImage, values: list[bytes], offset: int, chunk: int) -> MetadataDelta:
    delta = MetadataDelta(base)
    for start in range(0, len(values), chunk):
        delta.replay_values(values[start : start + chunk], offset, 7)
    return delta


def _assert_shared_when_equal(image: MetadataImage) -> None:
    for _, _, partition in image.iter_partitions():
        assert (partition.isr is partition.replicas) == (partition.isr == partition.replicas)


@settings(max_examples=150, deadline=None)
@given(
    first=st.lists(PAYLOADS, max_size=30),
    second=st.lists(PAYLOADS, max_size=30),
    chunk=st.integers(1, 8),
)
def test_bulk_replay_builds_exactly_the_image_of_record_by_record_replay(
    first: list[Message], second: list[Message], chunk: int
) -> None:
    # Two deltas in a row, so the second one replays on top of a non-empty image (shared parts).
    values = [records.encode_value(records.wrap(p)) for p in first]
    expected_delta = _one_by_one(MetadataImage.empty(), values, len(values))
    bulk_delta = _bulk(MetadataImage.empty(), values, len(values), chunk)
    expected, bulk = expected_delta.apply(), bulk_delta.apply()
    assert bulk == expected
    assert bulk_delta.replay_errors == expected_delta.replay_errors
    assert bulk_delta.in_transaction == expected_delta.in_transaction
    _assert_shared_when_equal(bulk)

    more = [records.encode_value(records.wrap(p)) for p in second]
    offset = len(values) + len(more)
    expected_next = _one_by_one(expected, more, offset)
    bulk_next = _bulk(bulk, more, offset, chunk)
    assert bulk_next.apply() == expected_next.apply()
    assert bulk_next.replay_errors == expected_next.replay_errors
    for broker_id in (1, 2, 3):
        assert bulk_next.local_changes(broker_id) == expected_next.local_changes(broker_id)


def test_decode_values_rejects_what_decode_value_rejects() -> None:
    good = records.encode_value(records.wrap(pb.TopicRecord(name="t", topic_id="T")))
    header_lies = good[:1] + bytes([records.ApiKey.PARTITION]) + good[2:]  # says partition, is topic
    for bad, code in [
        (header_lies, ErrorCode.CORRUPT_MESSAGE),
        (good[:2] + bytes([9]) + good[3:], ErrorCode.UNSUPPORTED_VERSION),
        (good[:5], ErrorCode.CORRUPT_MESSAGE),
        (b"\x02\x02\x00", ErrorCode.CORRUPT_MESSAGE),
    ]:
        with pytest.raises(KraftError) as one:
            records.decode_value(bad)
        with pytest.raises(KraftError) as bulk:
            list(records.decode_values([good, bad]))
        assert one.value.code == bulk.value.code == code
    assert list(records.decode_values([good, good])) == [records.decode_value(good)] * 2


async def _round_trip(path: Path, images: list[MetadataImage]) -> MetadataImage:
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        for image in images:
            await store.save(image)
    finally:
        await store.close()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        return await store.load()
    finally:
        await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(PAYLOADS, max_size=25), second=st.lists(PAYLOADS, max_size=25))
def test_store_round_trip_of_generated_images(first: list[Message], second: list[Message]) -> None:
    one = _bulk(MetadataImage.empty(), [records.encode_value(records.wrap(p)) for p in first], len(first), 5)
    image_one = one.apply()
    two = _bulk(
        image_one, [records.encode_value(records.wrap(p)) for p in second], len(first) + len(second), 5
    )
    image_two = two.apply()
    with tempfile.TemporaryDirectory() as tmp:
        loaded = asyncio.run(_round_trip(Path(tmp) / "image.sqlite", [image_one, image_two]))
    assert loaded == image_two
    _assert_shared_when_equal(loaded)


@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(PAYLOADS, max_size=30), wide=st.integers(0, 300))
def test_image_values_are_byte_identical_to_encoding_image_records(
    payloads: list[Message], wide: int
) -> None:
    delta = _bulk(MetadataImage.empty(), [records.encode_value(records.wrap(p)) for p in payloads], 9, 4)
    # One partition with a long replica list: its payload needs a multi-byte length prefix.
    delta.replay(records.wrap(pb.TopicRecord(name="wide", topic_id="W")))
    delta.replay(records.wrap(_partition("W", 0, list(range(1000, 1000 + wide)), None, 1000)))
    image = delta.apply()
    expected = [records.encode_value(r) for r in image_records(image)]
    assert list(image_values(image)) == expected
    rebuilt = MetadataDelta(MetadataImage.empty())
    rebuilt.replay_values(expected, image.offset, image.epoch)
    assert rebuilt.apply() == image


@settings(max_examples=100, deadline=None)
@given(
    payloads=st.lists(PAYLOADS, min_size=1, max_size=40),
    garbage=st.lists(st.integers(0, 40), max_size=2),
    base_offset=st.integers(0, 1000),
    already=st.integers(0, 10),
)
def test_a_log_backed_batch_replays_as_its_decoded_records(
    payloads: list[Message], garbage: list[int], base_offset: int, already: int
) -> None:
    # A follower's batch from the log (LazyRecords: decoded as (offset, value) pairs, no record objects)
    # replays to the same image, values and errors as the same records handed over one object each, and
    # skips what the committed image already holds.
    values = [records.encode_value(records.wrap(p)) for p in payloads]
    for position in garbage:  # values that are not metadata records (undecodable)
        values.insert(min(position, len(values)), b"\xffnot a record")
    raw = build_batch(base_offset, [(None, v) for v in values], leader_epoch=3, timestamp_ms=9)
    committed = MetadataDelta(MetadataImage.empty())
    committed.offset = base_offset + min(already, len(values)) - 1  # the first records are already in
    image = committed.apply()
    last = base_offset + len(values) - 1
    lazy = CommittedBatch(base_offset, last, 3, LazyRecords(raw, 0), 9)
    plain = CommittedBatch(
        base_offset, last, 3, [CommittedRecord(base_offset + i, v) for i, v in enumerate(values)], 9
    )
    via_log = asyncio.run(replay_batch(image, lazy))
    via_objects = asyncio.run(replay_batch(image, plain))
    assert via_log.image == via_objects.image
    assert via_log.values == via_objects.values
    assert via_log.undecodable == via_objects.undecodable
    assert via_log.replay_errors == via_objects.replay_errors
    fresh = [(base_offset + i, v) for i, v in enumerate(values) if base_offset + i > image.offset]
    assert via_log.values == [(o, v) for o, v in fresh if v != b"\xffnot a record"]
    # both views of the same log-backed records agree, in either order of first use
    for first in ("pairs", "records"):
        records_of = LazyRecords(raw, 0)
        if first == "records":
            assert [(r.offset, r.value) for r in records_of] == offset_values(records_of)
        else:
            assert offset_values(records_of) == [(r.offset, r.value) for r in records_of]


def test_a_long_batch_replays_in_steps_separated_by_the_given_pause() -> None:
    # The controller hands Raft's yield_turn in: a follower's next Fetch goes before the next step.
    count = 5 * REPLAY_SLICE_RECORDS
    values = [records.encode_value(records.wrap(pb.NoOpRecord())) for _ in range(count)]
    batch = CommittedBatch(0, count - 1, 1, [CommittedRecord(i, v) for i, v in enumerate(values)], 0)
    pauses = 0

    async def pause() -> None:
        nonlocal pauses
        pauses += 1
        await asyncio.sleep(0)

    replayed = asyncio.run(replay_batch(MetadataImage.empty(), batch, None, 0, pause))
    assert replayed.image.offset == count - 1
    assert pauses >= count // REPLAY_SLICE_RECORDS - 1  # one at least every slice of records
