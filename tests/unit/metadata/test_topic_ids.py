"""Topic ids from a pool of OS random bytes (``kraft.metadata.topic_ids``, issue #17): version-4 UUID
strings exactly as ``uuid.uuid4()`` formats them, one ``os.urandom`` call per pool, never the same id
twice, and a fresh pool after a fork."""

from __future__ import annotations

import itertools
import os
import uuid

from kraft.metadata import topic_ids
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.metadata.topic_ids import POOL_IDS, TopicIds, format_uuid4
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER
from .test_work_budget import unfenced_brokers


class CountingSource:
    """Deterministic bytes (a counter), and how often and how much was asked."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self._next = itertools.count()

    def __call__(self, size: int) -> bytes:
        self.calls.append(size)
        return b"".join(next(self._next).to_bytes(16, "big") for _ in range(size // 16))


def test_an_id_is_what_uuid_formats_for_the_same_bytes_as_version_4() -> None:
    for raw in [bytes(16), b"\xff" * 16, *(os.urandom(16) for _ in range(500))]:
        text = format_uuid4(raw)
        assert text == str(uuid.UUID(bytes=raw, version=4))
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_one_random_read_serves_a_pool_of_ids_all_different() -> None:
    source = CountingSource()
    ids = TopicIds(source)
    drawn = [ids() for _ in range(3 * POOL_IDS + 1)]
    assert source.calls == [16 * POOL_IDS] * 4  # one read per pool, not one per id
    assert len(set(drawn)) == len(drawn)
    # each id is made of its own 16 bytes, in order: the first pool's ids are the counter 0, 1, 2, ...
    assert drawn[:3] == [format_uuid4(i.to_bytes(16, "big")) for i in range(3)]
    assert drawn[POOL_IDS] == format_uuid4(POOL_IDS.to_bytes(16, "big"))


def test_a_forked_child_does_not_reuse_the_parents_pool() -> None:
    source = CountingSource()
    ids = TopicIds(source)
    ids()
    assert len(source.calls) == 1
    topic_ids._drop_inherited_pools()  # what os.register_at_fork runs in a child
    ids()
    assert len(source.calls) == 2  # the rest of the inherited pool was not handed out


def test_the_controller_logic_gives_each_topic_a_random_version_4_id_by_default() -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(logic, [None])
    names = [f"t{i}" for i in range(300)]
    for name in names:
        topic = cpb.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
        out = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(log))
        log.extend(out.records)
    ids = [logic.image.topic_ids_by_name[name] for name in names]
    assert len(set(ids)) == len(ids)
    assert all(uuid.UUID(topic_id).version == 4 for topic_id in ids)
