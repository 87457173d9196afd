"""An image as the records that rebuild it — the content of snapshots (Raft and MetadataFetch).

Replaying ``image_records(image)`` into an empty delta gives back an image equal to ``image`` (apart from
its offset, which the snapshot id carries).  The generator yields in small steps so a caller on the event
loop can pause between chunks while snapshotting a million partitions.
"""

from __future__ import annotations

from collections.abc import Iterator

from kraft.metadata import records as rec
from kraft.metadata.acl_records import acl_record
from kraft.metadata.image import MetadataImage, PartitionRegistration
from kraft.storage.varint import encode_uvarint
from kraft.v1 import common_pb2
from kraft.v1 import metadata_pb2 as pb


def partition_record(topic_id: str, partition_id: int, p: PartitionRegistration) -> pb.PartitionRecord:
    """The PartitionRecord that recreates registration ``p`` (every field the image keeps)."""
    return pb.PartitionRecord(
        partition_id=partition_id,
        topic_id=topic_id,
        replicas=p.replicas,
        isr=p.isr,
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        eligible_leader_replicas=p.elr,
        last_known_elr=p.last_known_elr,
        leader_recovery_state=p.leader_recovery_state,
        last_unclean_leader_epoch=p.last_unclean_leader_epoch,
    )


def image_records(image: MetadataImage, partitions: bool = True) -> Iterator[pb.MetadataRecord]:
    """The records rebuilding ``image``; ``partitions=False`` leaves out every PartitionRecord (a topic's
    follow its TopicRecord; :func:`image_values` frames them itself)."""
    wrap = rec.wrap
    for name, level in sorted(image.features.items()):
        yield wrap(pb.FeatureLevelRecord(name=name, feature_level=level))
    for broker in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        record = pb.RegisterBrokerRecord(
            broker_id=broker.broker_id,
            incarnation_id=broker.incarnation_id,
            broker_epoch=broker.epoch,
            endpoints=[
                common_pb2.Endpoint(
                    name=e.name, host=e.host, port=e.port, security_protocol=e.security_protocol
                )
                for e in broker.endpoints
            ],
            features=[
                pb.BrokerFeature(
                    name=f.name, min_supported_version=f.min_version, max_supported_version=f.max_version
                )
                for f in broker.features
            ],
            fenced=broker.fenced,
            in_controlled_shutdown=broker.in_controlled_shutdown,
            log_dirs=broker.log_dirs,
            unclean_shutdown=broker.unclean_shutdown,
        )
        if broker.rack is not None:
            record.rack = broker.rack
        yield wrap(record)
        if broker.offline_replicas:  # only then: snapshots of brokers without any keep their bytes
            yield wrap(
                pb.BrokerRegistrationChangeRecord(
                    broker_id=broker.broker_id,
                    broker_epoch=broker.epoch,
                    offline_replicas=rec.offline_replicas_records(broker.offline_replicas),
                )
            )
    for topic in image.topics_by_id.values():
        yield wrap(pb.TopicRecord(name=topic.name, topic_id=topic.topic_id))
        if not partitions:
            continue
        for partition_id, p in enumerate(topic.partitions):
            yield wrap(partition_record(topic.topic_id, partition_id, p))
    for key, values in image.configs.items():
        for name, value in sorted(values.items()):
            yield wrap(
                pb.ConfigRecord(
                    resource_type=key.resource_type, resource_name=key.resource_name, name=name, value=value
                )
            )
    for acl_id, acl in sorted(image.acls.items()):
        yield wrap(acl_record(acl_id, acl))


def image_values(image: MetadataImage) -> Iterator[bytes]:
    """``encode_value`` of every record of :func:`image_records`, byte for byte, about twice as fast:
    PartitionRecords (nearly all of a big image) are framed directly instead of wrapped and copied."""
    encode = rec.encode_value
    partition_prefix = _partition_prefix
    for record in image_records(image, partitions=False):
        yield encode(record)
        if record.WhichOneof("record") != "topic":
            continue
        topic = image.topics_by_id[record.topic.topic_id]
        topic_id = topic.topic_id
        for partition_id, p in enumerate(topic.partitions):
            payload = partition_record(topic_id, partition_id, p).SerializeToString()
            yield partition_prefix(len(payload)) + payload


# A MetadataRecord holding only its oneof field ``partition`` serializes as that field's tag, the
# payload length and the payload (protobuf wire format), so the value is header + tag + length + payload.
_PARTITION_FIELD = pb.MetadataRecord.DESCRIPTOR.fields_by_name["partition"].number
_PARTITION_HEADER = (
    encode_uvarint(rec.FRAME_VERSION)
    + encode_uvarint(rec.ApiKey.PARTITION)
    + encode_uvarint(rec.RECORD_VERSIONS[rec.ApiKey.PARTITION])
    + encode_uvarint(_PARTITION_FIELD << 3 | 2)  # wire type 2: length-delimited
)
_PARTITION_PREFIXES = [_PARTITION_HEADER + encode_uvarint(n) for n in range(256)]


def _partition_prefix(size: int) -> bytes:
    return _PARTITION_PREFIXES[size] if size < 256 else _PARTITION_HEADER + encode_uvarint(size)
