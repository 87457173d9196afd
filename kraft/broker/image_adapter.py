"""The one boundary between :mod:`kraft.metadata`'s image/delta and the broker's own types.

- :func:`to_local_changes` (:func:`to_local_changes_in_steps`: in bounded steps) turns a delta's
  ``LocalReplicaChanges`` into :class:`LocalChanges`;
- :func:`local_assignments` (:func:`local_assignments_in_steps`: in bounded steps) lists the image's
  partitions hosted by a broker (for full reconciliation);
- :class:`ImageMetadataView` answers BrokerService's Metadata / leader look-ups from an image.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from itertools import islice

from kraft.broker.types import LocalChanges, PartitionAssignment, TopicPartition
from kraft.errors import ErrorCode
from kraft.metadata.delta import LocalPartition, LocalReplicaChanges
from kraft.metadata.image import NO_PARTITION_LEADER, BrokerRegistration, MetadataImage, PartitionRegistration
from kraft.metadata.image import Endpoint as ImageEndpoint
from kraft.v1 import broker_pb2 as pb
from kraft.v1.common_pb2 import Endpoint, NodeRef


def _assignment(topic_id: str, registration: PartitionRegistration) -> PartitionAssignment:
    return PartitionAssignment(
        topic_id=topic_id,
        leader=registration.leader,
        leader_epoch=registration.leader_epoch,
        partition_epoch=registration.partition_epoch,
        replicas=registration.replicas,
        isr=registration.isr,
        leader_recovery_state=registration.leader_recovery_state,
        last_unclean_leader_epoch=registration.last_unclean_leader_epoch,
    )


def _entry(local: LocalPartition) -> tuple[TopicPartition, PartitionAssignment]:
    tp = TopicPartition(local.topic_name, local.partition_id)
    return tp, _assignment(local.topic_id, local.registration)


CONVERT_STEP = 256
"""Partitions :func:`to_local_changes_in_steps` converts between two pauses (~0.2 ms)."""


def to_local_changes(changes: LocalReplicaChanges) -> LocalChanges:
    """``changes`` as :class:`LocalChanges`, in one go (``changes`` is emptied)."""
    out = LocalChanges({}, {}, {})
    for _ in to_local_changes_in_steps(changes, out):
        pass
    return out


def to_local_changes_in_steps(changes: LocalReplicaChanges, out: LocalChanges) -> Iterator[None]:
    """Convert ``changes`` into ``out`` (whose mappings must be dicts, empty), pausing (yielding) after
    every :data:`CONVERT_STEP` partitions: a broker hosting a deleted 100,000-partition topic has
    100,000 deletes to convert (~75 ms of CPU in one go). ``changes``' lists are emptied as they are
    converted, so their entries are freed a step at a time too, not all at once at the end. Each
    mapping is filled in the order of its list, as the one-go conversion did."""
    deletes = out.deletes
    leaders = out.leaders
    followers = out.followers
    assert isinstance(deletes, dict) and isinstance(leaders, dict) and isinstance(followers, dict)
    step = CONVERT_STEP
    for source in (changes.deletes, changes.leaders, changes.followers):
        source.reverse()  # consumed from the end (O(1) a step), i.e. in the original order
        while source:
            piece = source[-step:]
            del source[-step:]
            piece.reverse()
            if source is changes.deletes:
                for p in piece:
                    deletes[TopicPartition(p.topic_name, p.partition_id)] = p.topic_id
            else:
                into = leaders if source is changes.leaders else followers
                for p in piece:
                    tp, assignment = _entry(p)
                    into[tp] = assignment
            del piece
            if source:  # (not after the last piece: a small delta converts without a pause, and its
                yield  # revocations are applied before anything else runs, as before the slicing)


ASSIGNMENT_STEP = 256
"""Partitions of the image :func:`local_assignments_in_steps` looks at between two pauses (~0.7 ms when
all of them are hosted here: a ``TopicPartition`` and a ``PartitionAssignment`` made for each)."""


def local_assignments(image: MetadataImage, broker_id: int) -> dict[TopicPartition, PartitionAssignment]:
    """Every partition of ``image`` that has ``broker_id`` among its replicas."""
    hosted: dict[TopicPartition, PartitionAssignment] = {}
    for _ in local_assignments_in_steps(image, broker_id, hosted):
        pass
    return hosted


def local_assignments_in_steps(
    image: MetadataImage, broker_id: int, hosted: dict[TopicPartition, PartitionAssignment]
) -> Iterator[None]:
    """:func:`local_assignments` into ``hosted`` (empty), pausing (yielding) after every
    :data:`ASSIGNMENT_STEP` partitions looked at, however they are spread over topics: a broker hosting
    100,000 partitions walked them in one ~0.3 s stretch before opening them at start-up or comparing
    them with a snapshot's image.  Same entries in the same order; ``image`` is immutable, so the walk
    sees one image throughout."""
    step = ASSIGNMENT_STEP
    looked_at = 0
    for topic in image.topics_by_id.values():
        name, topic_id = topic.name, topic.topic_id
        numbered = enumerate(topic.partitions)
        while piece := list(islice(numbered, step - looked_at)):
            for partition_id, registration in piece:
                if broker_id in registration.replicas:
                    hosted[TopicPartition(name, partition_id)] = _assignment(topic_id, registration)
            looked_at += len(piece)
            if looked_at >= step:
                looked_at = 0
                yield


def image_digest(image: MetadataImage) -> str:
    """SHA-256 over the image's content in a canonical order (not its offset): two brokers that applied
    the same records have the same digest."""
    h = hashlib.sha256()
    for broker_id in sorted(image.brokers):
        b = image.brokers[broker_id]
        h.update(repr((b.broker_id, b.epoch, b.incarnation_id, b.endpoints, b.rack, b.fenced)).encode())
        h.update(repr((b.in_controlled_shutdown, b.features, b.log_dirs)).encode())
        if b.unclean_shutdown:  # (an image without it keeps the digest it had before the flag existed)
            h.update(b"unclean_shutdown")
        if b.offline_replicas:  # (likewise)
            h.update(repr(sorted(b.offline_replicas)).encode())
    for name in sorted(image.topic_ids_by_name):
        topic = image.topics_by_id[image.topic_ids_by_name[name]]
        # (as a tuple: the digest images had before partitions were chunked sequences)
        h.update(repr((name, topic.topic_id, tuple(topic.partitions))).encode())
    for key in sorted(image.configs):
        h.update(repr((key, sorted(image.configs[key].items()))).encode())
    h.update(repr(sorted(image.features.items())).encode())
    if image.acls:  # (an image without ACLs keeps the digest it had before ACLs existed)
        h.update(repr(sorted(image.acls.items())).encode())
    return h.hexdigest()


class ImageMetadataView:
    """Client metadata from one immutable image; ``listener`` names the endpoint clients use."""

    def __init__(self, image: MetadataImage, listener: str = "PLAINTEXT") -> None:
        self.image = image
        self.listener = listener
        self._digest: str | None = None

    def digest(self) -> str:
        """:func:`image_digest` of the image, computed once (only DescribeBroker asks for it)."""
        if self._digest is None:
            self._digest = image_digest(self.image)
        return self._digest

    def topic_exists(self, topic: str) -> bool:
        return topic in self.image.topic_ids_by_name

    def topic_config(self, topic: str, name: str) -> str | None:
        return self.image.topic_configs(topic).get(name)

    def broker_config(self, broker_id: int, name: str) -> str | None:
        return self.image.broker_config(broker_id, name)

    def finalized_features(self) -> tuple[Mapping[str, int], int]:
        return self.image.features, self.image.offset

    def node_ref(self, broker_id: int) -> NodeRef:
        registration = self.image.brokers.get(broker_id)
        if registration is None:
            return NodeRef(node_id=-1)
        endpoint = self._client_endpoint(registration)
        return NodeRef(node_id=broker_id, endpoint=endpoint) if endpoint else NodeRef(node_id=broker_id)

    def metadata_response(self, topics: list[str]) -> pb.BrokerMetadataResponse:
        image = self.image
        response = pb.BrokerMetadataResponse(metadata_offset=image.offset)
        for broker_id in sorted(image.brokers):
            registration = image.brokers[broker_id]
            response.brokers.append(
                pb.BrokerMetadataResponse.Broker(
                    broker_id=broker_id,
                    endpoints=[_endpoint(e) for e in registration.endpoints],
                    rack=registration.rack or "",
                    fenced=registration.fenced,
                )
            )
        names = topics or sorted(image.topic_ids_by_name)
        for name in names:
            topic = image.topic(name)
            if topic is None:
                response.topics.append(
                    pb.BrokerMetadataResponse.Topic(
                        name=name,
                        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        error_message=f"unknown topic {name!r}",
                    )
                )
                continue
            response.topics.append(
                pb.BrokerMetadataResponse.Topic(
                    name=name,
                    topic_id=topic.topic_id,
                    partitions=[
                        pb.BrokerMetadataResponse.Partition(
                            partition=pid,
                            leader=p.leader,
                            leader_epoch=p.leader_epoch,
                            replicas=p.replicas,
                            isr=p.isr,
                            error_code=ErrorCode.LEADER_NOT_AVAILABLE
                            if p.leader == NO_PARTITION_LEADER
                            else 0,
                        )
                        for pid, p in enumerate(topic.partitions)
                    ],
                )
            )
        return response

    def _client_endpoint(self, registration: BrokerRegistration) -> Endpoint | None:
        chosen = next((e for e in registration.endpoints if e.name == self.listener), None)
        if chosen is None and registration.endpoints:
            chosen = registration.endpoints[0]
        return None if chosen is None else _endpoint(chosen)


def _endpoint(e: ImageEndpoint) -> Endpoint:
    return Endpoint(name=e.name, host=e.host, port=e.port, security_protocol=e.security_protocol)
