"""Reading controller metadata logs from disk: records, torn tails, images replayed to an offset."""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

from chaos.collect import (
    broker_registration_offsets,
    image_digests_at,
    iter_metadata_log,
    node_log,
    read_metadata_records,
)
from kraft.broker.image_adapter import image_digest
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import decode_value, encode_value, wrap
from kraft.storage.batch import build_batch
from kraft.storage.log import METADATA_LOG_DIR_NAME
from kraft.v1 import metadata_pb2


def _topic(i: int) -> bytes:
    return encode_value(
        wrap(metadata_pb2.TopicRecord(name=f"t{i}", topic_id=f"00000000-0000-0000-0000-{i:012d}"))
    )


def _write_log(root: Path, batches: list[bytes]) -> Path:
    directory = root / METADATA_LOG_DIR_NAME
    directory.mkdir(parents=True)
    (directory / f"{0:020d}.log").write_bytes(b"".join(batches))
    return root


def test_records_are_read_in_offset_order_and_a_torn_tail_is_ignored(tmp_path: Path) -> None:
    first = build_batch(0, [(None, _topic(0)), (None, _topic(1))], leader_epoch=1, timestamp_ms=1)
    second = build_batch(2, [(None, _topic(2))], leader_epoch=2, timestamp_ms=2)
    root = _write_log(tmp_path, [first, second, second[:10]])
    entries = list(iter_metadata_log(root))
    assert [(e.offset, e.epoch) for e in entries] == [(0, 1), (1, 1), (2, 2)]
    records = read_metadata_records(root)
    assert records[2].endswith(_topic(2)) and records[0] != records[1]
    log = node_log(1, root, high_watermark=3)
    assert (log.node_id, log.high_watermark, log.log_start_offset, len(log.records)) == (1, 3, 0, 3)


def test_image_digests_match_a_direct_replay_and_stop_at_the_hwm(tmp_path: Path) -> None:
    values = [_topic(i) for i in range(4)]
    root = _write_log(tmp_path, [build_batch(0, [(None, v) for v in values], leader_epoch=1, timestamp_ms=1)])
    delta = MetadataDelta(MetadataImage.empty())
    for offset, value in enumerate(values[:2]):
        delta.replay(decode_value(value), offset, 1)
    expected = image_digest(delta.apply())
    digests = image_digests_at(root, [1, 3], high_watermark=3)
    assert digests == {1: expected}  # offset 3 is not committed
    assert image_digests_at(root, [], high_watermark=3) == {}


def test_a_log_that_does_not_start_at_zero_gives_no_digests(tmp_path: Path) -> None:
    root = _write_log(tmp_path, [build_batch(5, [(None, _topic(5))], leader_epoch=1, timestamp_ms=1)])
    assert image_digests_at(root, [5], high_watermark=10) == {}


def test_broker_registration_offsets_below_the_hwm(tmp_path: Path) -> None:
    def record(payload: Message) -> bytes:
        return encode_value(wrap(payload))

    values = [
        record(metadata_pb2.RegisterBrokerRecord(broker_id=101, broker_epoch=0, fenced=True)),  # 0
        _topic(1),  # 1
        record(metadata_pb2.BrokerRegistrationChangeRecord(broker_id=101, broker_epoch=0, fenced=-1)),  # 2
        record(metadata_pb2.RegisterBrokerRecord(broker_id=102, broker_epoch=3, fenced=True)),  # 3
        record(metadata_pb2.FenceBrokerRecord(id=101, epoch=0)),  # 4
        b"not a metadata record",  # 5: a raw test append
        record(metadata_pb2.UnfenceBrokerRecord(id=101, epoch=0)),  # 6
        record(metadata_pb2.UnregisterBrokerRecord(broker_id=102, broker_epoch=3)),  # 7: not committed
    ]
    root = _write_log(tmp_path, [build_batch(0, [(None, v) for v in values], leader_epoch=1, timestamp_ms=1)])
    assert broker_registration_offsets(root, high_watermark=7) == {101: [0, 2, 4, 6], 102: [3]}
