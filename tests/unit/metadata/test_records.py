"""Record framing: every record kind round-trips, bad bytes give a clear error."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.v1 import common_pb2
from kraft.v1 import metadata_pb2 as pb

SAMPLES = [
    pb.RegisterBrokerRecord(
        broker_id=1,
        incarnation_id="inc",
        broker_epoch=7,
        rack="r1",
        fenced=True,
        endpoints=[common_pb2.Endpoint(name="PLAINTEXT", host="h", port=9092)],
        features=[
            pb.BrokerFeature(name="metadata.version", min_supported_version=1, max_supported_version=3)
        ],
    ),
    pb.UnregisterBrokerRecord(broker_id=1, broker_epoch=7),
    pb.TopicRecord(name="t", topic_id="id"),
    pb.PartitionRecord(partition_id=0, topic_id="id", replicas=[1, 2], isr=[1, 2], leader=1),
    pb.ConfigRecord(resource_type=2, resource_name="t", name="retention.ms", value="1"),
    pb.PartitionChangeRecord(partition_id=0, topic_id="id", isr=pb.BrokerIdList(ids=[1]), leader=1),
    pb.FenceBrokerRecord(id=1, epoch=7),
    pb.UnfenceBrokerRecord(id=1, epoch=7),
    pb.RemoveTopicRecord(topic_id="id"),
    pb.FeatureLevelRecord(name="metadata.version", feature_level=3),
    pb.BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=7, fenced=-1),
    pb.AccessControlEntryRecord(
        id="acl",
        resource_type=2,
        resource_name="t",
        pattern_type=3,
        principal="User:a",
        host="*",
        operation=3,
        permission_type=3,
    ),
    pb.RemoveAccessControlEntryRecord(id="acl"),
    pb.NoOpRecord(),
    pb.BeginTransactionRecord(name="x"),
    pb.EndTransactionRecord(),
    pb.AbortTransactionRecord(),
    pb.ClearElrRecord(topic_name="t"),
]

EXPECTED_KEYS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 17, 18, 19, 20, 23, 24, 25, 28]


@pytest.mark.parametrize(("payload", "key"), list(zip(SAMPLES, EXPECTED_KEYS, strict=True)))
def test_every_record_kind_round_trips_with_its_kafka_api_key(payload: Message, key: int) -> None:
    record = records.wrap(payload)
    value = records.encode_value(record)
    assert records.peek_api_key(value) == key
    assert records.decode_value(value) == record
    rendered = records.describe_value(value)
    assert rendered["api_key"] == key
    assert rendered["type"] == type(payload).__name__


def test_every_oneof_field_is_covered_by_the_samples() -> None:
    fields = {f.name for f in pb.MetadataRecord.DESCRIPTOR.oneofs_by_name["record"].fields}
    assert {records.kind(records.wrap(p)) for p in SAMPLES} == fields


def test_unset_optional_config_value_means_delete_and_survives_round_trip() -> None:
    record = records.wrap(pb.ConfigRecord(resource_type=2, resource_name="t", name="k"))
    decoded = records.decode_value(records.encode_value(record))
    assert not decoded.config.HasField("value")


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b"", ErrorCode.CORRUPT_MESSAGE),
        (b"\x02\x02\x00", ErrorCode.CORRUPT_MESSAGE),  # unknown frame version
        (b"\x01\x63\x00", ErrorCode.CORRUPT_MESSAGE),  # unknown api key 99
        (b"\x01\x02\x05", ErrorCode.UNSUPPORTED_VERSION),  # record version from the future
        (b"\x01\x02\x00\xff\xff", ErrorCode.CORRUPT_MESSAGE),  # garbage payload
        (
            b"\x01\x03\x00" + records.encode_value(records.wrap(pb.TopicRecord(name="t")))[3:],
            ErrorCode.CORRUPT_MESSAGE,
        ),  # header says partition, payload is topic
    ],
)
def test_bad_values_raise_a_coded_error(value: bytes, code: ErrorCode) -> None:
    with pytest.raises(KraftError) as info:
        records.decode_value(value)
    assert info.value.code == code
    assert records.describe_value(value)["type"] == "Undecodable"


def test_wrap_rejects_a_message_that_is_not_a_record() -> None:
    with pytest.raises(TypeError):
        records.wrap(common_pb2.Endpoint())
