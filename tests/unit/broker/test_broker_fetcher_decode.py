"""MetadataFetcher (session 17): a response is decoded in pieces by ``decode_replay_values`` (new
PartitionRecords and the common PartitionChangeRecords read without upb) and replayed with
``replay_decoded_steps``; against replaying every record through upb one by one (the fetcher before it):
the same published image, offset and epoch — or the same fatal error, naming the same offset — for any
mix of records kraft writes, records that do not fit the image, and corrupted values."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from broker_fakes import MemoryImageStore, metadata_fetcher, started_publisher
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata import change_decode
from kraft.metadata.delta import MetadataDelta, UnreplayableRecordError, unreplayable
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import decode_value, encode_value, wrap
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

ME = 4
_TOPICS = st.sampled_from(["T"] * 6 + ["U", "V"])  # T exists, U is created by a record (maybe), V never
_IDS = st.lists(st.integers(1, 5) | st.integers(128, 1100), max_size=4)


def _base() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(wrap(mpb.TopicRecord(name="t", topic_id="T")), 0, 1)
    for p in range(3):
        record = mpb.PartitionRecord(
            topic_id="T", partition_id=p, replicas=[1, 2, ME], isr=[1, 2, ME], leader=1
        )
        if p == 2:  # an ELR to clear
            record.eligible_leader_replicas.extend([2])
        delta.replay(wrap(record), 1 + p, 1)
    return delta.apply()


# The strategies the composites draw from, built once: one built inside a composite is a new object at
# every draw, which Hypothesis validates again each time (sampled_from of a list and a composite's call
# are never cached).  The same strategies: the same examples.
_KINDS = st.sampled_from(["partition", "partition", "change", "change", "change", "topic", "other"])
_TOPIC_NAMES = st.sampled_from(["u", "t"])
_DAMAGES = st.sampled_from(["as is"] * 30 + ["truncated", "byte", "appended", "random"])


@st.composite
def _records(draw: st.DrawFn) -> mpb.MetadataRecord:
    kind = draw(_KINDS)
    if kind == "partition":
        replicas = draw(_IDS)
        record = mpb.PartitionRecord(
            topic_id=draw(_TOPICS),
            partition_id=draw(st.integers(0, 3)),
            replicas=replicas,
            isr=replicas if draw(st.booleans()) else draw(_IDS),
            leader=draw(st.integers(-1, 5)),
            leader_epoch=draw(st.integers(0, 3)),
            partition_epoch=draw(st.integers(0, 3)),
        )
        if draw(st.integers(0, 4)) == 0:  # a rarer field: through upb
            record.eligible_leader_replicas.extend(draw(_IDS))
        return wrap(record)
    if kind == "change":
        change = mpb.PartitionChangeRecord(topic_id=draw(_TOPICS), partition_id=draw(st.integers(0, 3)))
        if draw(st.booleans()):
            change.isr.ids.extend(draw(_IDS))
        if draw(st.booleans()):
            change.leader = draw(st.integers(-1, 5))
        if draw(st.integers(0, 4)) == 0:
            change.leader_recovery_state = 1
        return wrap(change)
    if kind == "topic":
        return wrap(mpb.TopicRecord(name=draw(_TOPIC_NAMES), topic_id="U"))
    return draw(
        st.sampled_from(
            [
                wrap(mpb.ClearElrRecord(topic_name="t")),
                wrap(mpb.ClearElrRecord()),
                wrap(mpb.FeatureLevelRecord(name="f", feature_level=2)),
            ]
        )
    )


_RECORDS = _records()


@st.composite
def _values(draw: st.DrawFn) -> bytes:
    value = encode_value(draw(_RECORDS))
    how = draw(_DAMAGES)
    if how == "truncated":
        value = value[: draw(st.integers(0, len(value) - 1))]
    elif how == "byte":
        at = draw(st.integers(0, len(value) - 1))
        value = value[:at] + bytes([draw(st.integers(0, 255))]) + value[at + 1 :]
    elif how == "appended":
        value += draw(st.binary(min_size=1, max_size=4))
    elif how == "random":
        value = value[:4] + draw(st.binary(max_size=20))
    return value


class ResponsesController:
    """Answers MetadataFetch at each response's first offset with that response's records."""

    active_controller_id = 1

    def __init__(self, responses: list[list[cpb.CommittedRecord]]) -> None:
        self.end = responses[-1][-1].offset + 1
        self.by_offset = {records[0].offset: records for records in responses}

    async def call(
        self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        records = self.by_offset.get(request.fetch_offset, [])
        return cpb.MetadataFetchResponse(error_code=ErrorCode.NONE, high_watermark=self.end, records=records)


def _expected(base: MetadataImage, responses: list[list[cpb.CommittedRecord]]) -> list[MetadataImage | str]:
    """Each response replayed record by record through upb (the fetcher before session 17): the image
    it publishes, or the message of the error it stops on (and nothing after)."""
    out: list[MetadataImage | str] = []
    image = base
    for records in responses:
        delta = MetadataDelta(image)
        undecodable: list[tuple[int, str]] = []
        for record in records:
            try:
                decoded = decode_value(record.value)
            except KraftError as exc:
                undecodable.append((record.offset, exc.message))
                continue
            delta.replay(decoded, record.offset, record.leader_epoch)
        error = unreplayable("metadata", records[-1].offset, undecodable, list(delta.replay_errors))
        if error is not None:
            out.append(error.message)
            return out
        image = delta.apply()
        out.append(image)
    return out


async def _fetched(base: MetadataImage, responses: list[list[cpb.CommittedRecord]], root: Path) -> list[Any]:
    store = MemoryImageStore()
    store.image = base
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, root, store, clock)
    fetcher = metadata_fetcher(ME, ResponsesController(responses), publisher, clock)
    out: list[MetadataImage | str] = []
    try:
        for _ in responses:
            try:
                assert await fetcher.fetch_once()
            except UnreplayableRecordError as exc:
                assert exc.code is ErrorCode.CORRUPT_MESSAGE
                out.append(exc.message)
                return out
            out.append(publisher.image)
        return out
    finally:
        await publisher.flush()
        manager.close()


def _same(got: MetadataImage | str, expected: MetadataImage | str) -> bool:
    if isinstance(got, str) or isinstance(expected, str):
        return got == expected
    return (got.offset, got.epoch, got.features, got.topics_by_id) == (
        expected.offset,
        expected.epoch,
        expected.features,
        expected.topics_by_id,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_values(), min_size=1, max_size=100), st.data())
def test_a_response_replays_as_record_by_record_upb_replay_does(
    values: list[bytes], data: st.DataObject
) -> None:
    base = _base()
    split = data.draw(st.integers(1, len(values)))  # two responses (the second maybe empty: left out)
    records = [
        cpb.CommittedRecord(offset=base.offset + 1 + i, leader_epoch=2 if i < split else 3, value=value)
        for i, value in enumerate(values)
    ]
    responses = [part for part in (records[:split], records[split:]) if part]
    expected = _expected(base, responses)
    with tempfile.TemporaryDirectory() as root:
        got = asyncio.run(_fetched(base, responses, Path(root)))
    event("stopped on an error" if isinstance(expected[-1], str) else "published")
    event(f"responses: {len(responses)}")
    assert len(got) == len(expected)
    for one, other in zip(got, expected, strict=True):
        assert _same(one, other), (one, other)


async def test_new_partitions_and_common_changes_are_read_without_upb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(what keeps the fast path from quietly going unused on the broker: each PartitionRecord of a new
    partition and each common PartitionChangeRecord is read by ``change_decode``, not by upb)"""
    read: list[object] = []
    plain, change = change_decode.plain_partition, change_decode.isr_leader_change

    def counted_plain(value: bytes) -> Any:
        got = plain(value)
        read.append(got)
        return got

    def counted_change(value: bytes) -> Any:
        got = change(value)
        read.append(got)
        return got

    monkeypatch.setattr(change_decode, "plain_partition", counted_plain)
    monkeypatch.setattr(change_decode, "isr_leader_change", counted_change)
    base = _base()
    values = [encode_value(wrap(mpb.TopicRecord(name="u", topic_id="U")))]
    values += [
        encode_value(
            wrap(mpb.PartitionRecord(topic_id="U", partition_id=p, replicas=[ME, 900], isr=[ME, 900]))
        )
        for p in range(100)
    ]
    values += [
        encode_value(wrap(mpb.PartitionChangeRecord(topic_id="U", partition_id=p, leader=900)))
        for p in range(100)
    ]
    records = [
        cpb.CommittedRecord(offset=base.offset + 1 + i, leader_epoch=2, value=v) for i, v in enumerate(values)
    ]
    got = await _fetched(base, [records], tmp_path)
    assert len(read) == 200 and None not in read
    image = got[0]
    assert isinstance(image, MetadataImage) and image.offset == records[-1].offset
    assert all(image.partition("U", p).leader == 900 for p in range(100))  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [0, 31, 32, 70, 99])
async def test_the_error_names_the_offset_of_the_value_that_does_not_decode(tmp_path: Path, bad: int) -> None:
    """Wherever in a long response (a piece's first, last, a later piece's), and only that value left out."""
    base = _base()
    values = [
        encode_value(wrap(mpb.PartitionChangeRecord(topic_id="T", partition_id=p % 3, leader=p % 3 + 1)))
        for p in range(100)
    ]
    values[bad] = values[bad][:-1]  # truncated: upb cannot read it
    records = [
        cpb.CommittedRecord(offset=base.offset + 1 + i, leader_epoch=2, value=v) for i, v in enumerate(values)
    ]
    expected = _expected(base, [records])
    assert isinstance(expected[0], str) and f"at offset {records[bad].offset} " in expected[0]
    assert "1 bad record;" in expected[0]
    assert await _fetched(base, [records], tmp_path) == expected
