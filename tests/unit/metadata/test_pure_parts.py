"""Placement, the partition change builder, the heartbeat tracker and snapshot content (pure modules)."""

from __future__ import annotations

from collections import Counter

import pytest

from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.fetch_window import FetchWindow, WindowBatch
from kraft.metadata.heartbeats import HeartbeatTracker
from kraft.metadata.image import NO_PARTITION_LEADER, MetadataImage, PartitionRegistration
from kraft.metadata.image_records import image_records
from kraft.metadata.partition_change import build_change, choose_leader
from kraft.metadata.placement import UsableBroker, place_replicas, rack_alternated, validate_assignment
from kraft.v1 import controller_pb2 as cpb


def test_rack_alternated_order_interleaves_racks() -> None:
    brokers = [UsableBroker(i, r) for i, r in [(1, "a"), (2, "a"), (3, "b"), (4, "c"), (5, "b")]]
    assert [b.broker_id for b in rack_alternated(brokers)] == [1, 3, 4, 2, 5]


def test_placement_is_even_and_uses_every_rack_it_can() -> None:
    brokers = [UsableBroker(i, f"r{i % 3}") for i in range(1, 10)]
    placed = place_replicas(brokers, 90, 3, start_index=4)
    assert Counter(p[0] for p in placed) == dict.fromkeys(range(1, 10), 10)
    assert all(len({b % 3 for b in p}) == 3 and len(set(p)) == 3 for p in placed)


def test_placement_with_fewer_racks_than_replicas_still_fills_each_partition() -> None:
    brokers = [UsableBroker(1, "a"), UsableBroker(2, "a"), UsableBroker(3, "b")]
    placed = place_replicas(brokers, 6, 3, start_index=0)
    assert all(sorted(p) == [1, 2, 3] for p in placed)


@pytest.mark.parametrize(
    ("partitions", "factor", "code"),
    [(0, 1, ErrorCode.INVALID_PARTITIONS), (1, 0, ErrorCode.INVALID_REPLICATION_FACTOR),
     (1, 3, ErrorCode.INVALID_REPLICATION_FACTOR)],
)  # fmt: skip
def test_placement_rejects_impossible_requests(partitions: int, factor: int, code: ErrorCode) -> None:
    with pytest.raises(KraftError) as info:
        place_replicas([UsableBroker(1, None), UsableBroker(2, None)], partitions, factor, 0)
    assert info.value.code == code


def test_explicit_assignments_must_be_consistent() -> None:
    assert validate_assignment([[1, 2], [2, 1]], {1, 2}) == [(1, 2), (2, 1)]
    for bad, code in (
        ([[1, 2], [1]], ErrorCode.INVALID_REPLICATION_FACTOR),
        ([[1, 1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ([[3]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
    ):
        with pytest.raises(KraftError) as info:
            validate_assignment(bad, {1, 2})
        assert info.value.code == code


def test_leader_choice_prefers_the_preferred_replica_then_keeps_the_current_one() -> None:
    live = {1, 2, 3}.__contains__
    assert choose_leader((1, 2, 3), (1, 2, 3), 2, live) == 1
    assert choose_leader((1, 2, 3), (2, 3), 3, live) == 3
    assert choose_leader((1, 2, 3), (2, 3), 1, live) == 2
    assert choose_leader((1, 2, 3), (1,), 1, lambda b: b != 1) == NO_PARTITION_LEADER


def test_build_change_only_emits_what_changes() -> None:
    current = PartitionRegistration((1, 2), (1, 2), 1, 0, 0)
    assert build_change("T", 0, current, lambda b: True) is None
    change = build_change("T", 0, current, lambda b: b != 1, remove_from_isr=1)
    assert change is not None and list(change.isr.ids) == [2] and change.leader == 2
    offline = PartitionRegistration((1, 2), (1,), 1, 0, 0)
    last = build_change("T", 0, offline, lambda b: False, remove_from_isr=1)
    # KIP-966: the last member leaves the ISR (now empty) and stays eligible in the ELR.
    assert last is not None and last.HasField("isr") and list(last.isr.ids) == []
    assert list(last.eligible_leader_replicas.ids) == [1] and last.leader == NO_PARTITION_LEADER


def test_tracker_orders_by_contact_and_expires_one_at_a_time() -> None:
    tracker = HeartbeatTracker(session_timeout_ms=100)
    tracker.reset([(1, False), (2, False), (3, True)], now_ms=0)
    tracker.touch(1, 50, metadata_offset=7)
    assert tracker.next_expired(101) == 2
    tracker.set_fenced(2, True)
    assert tracker.next_expired(101) is None
    assert tracker.next_expired(151) == 1
    tracker.extend_all(100)
    assert tracker.next_expired(151) is None
    contact = tracker.contact(1)
    assert contact is not None and contact.metadata_offset == 7
    assert not tracker.has_valid_session(3, 1000)
    tracker.remove(1)
    assert tracker.contact(1) is None and tracker.unfenced_ids() == []


def test_snapshot_records_rebuild_an_equal_image() -> None:
    logic = ControllerLogic(ControllerSettings("c"), MetadataImage.empty(), 0)
    offset = 0
    for broker_id in (1, 2, 3):
        request = cpb.RegisterBrokerRequest(cluster_id="c", broker_id=broker_id, incarnation_id="i", rack="r")
        offset += len(logic.register_broker(request, 0, offset).records)
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id="c", broker_id=broker_id, broker_epoch=logic.image.brokers[broker_id].epoch,
            current_metadata_offset=offset,
        )  # fmt: skip
        offset += len(logic.broker_heartbeat(beat, 0, offset).records)
    topic = cpb.CreatableTopic(name="t", num_partitions=5, replication_factor=2)
    topic.configs.add(name="retention.ms", value="9")
    offset += len(
        logic.create_topics(cpb.CreateTopicsRequest(cluster_id="c", topics=[topic]), offset).records
    )
    fence = cpb.BrokerHeartbeatRequest(
        cluster_id="c", broker_id=2, broker_epoch=logic.image.brokers[2].epoch, want_fence=True
    )
    offset += len(logic.broker_heartbeat(fence, 0, offset).records)
    image = logic.image
    delta = MetadataDelta(MetadataImage.empty())
    for record in image_records(image):
        delta.replay(records.decode_value(records.encode_value(record)))
    delta.offset, delta.epoch = image.offset, image.epoch
    assert image.topic("t") is not None and image.brokers[2].fenced
    assert delta.apply() == image


def test_fetch_window_serves_whole_batches_and_trims_old_ones() -> None:
    window = FetchWindow(max_records=5)
    window.append(WindowBatch(0, 0, 1, 0, ()))  # a Raft control batch: no records
    window.append(WindowBatch(1, 2, 1, 0, ((1, b"a"), (2, b"b"))))
    window.append(WindowBatch(3, 5, 1, 0, ((3, b"c"), (4, b"d"), (5, b"e"))))
    assert [r.offset for r in window.read(0, 100)] == [1, 2, 3, 4, 5]
    assert [r.offset for r in window.read(2, 100)] == [2, 3, 4, 5]
    assert [r.offset for r in window.read(1, 3)] == [1, 2]  # never splits a batch…
    assert [r.offset for r in window.read(3, 1)] == [3, 4, 5]  # …but always returns one
    assert window.read(6, 100) == []
    window.append(WindowBatch(6, 6, 2, 0, ((6, b"f"),)))
    assert window.start_offset(-1) == 3  # the oldest batches were dropped to stay within 5 records
    window.clear()
    assert window.start_offset(42) == 42 and len(window) == 0
