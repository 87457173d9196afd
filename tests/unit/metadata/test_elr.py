"""KIP-966 eligible leader replicas: the pure rules (hypothesis), AlterPartition, replay and the image
store, and the controller's fence / rejoin / re-registration paths on a manual clock."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import (
    LEADER_RECOVERED,
    LEADER_RECOVERING,
    NO_PARTITION_LEADER,
    MetadataImage,
    PartitionRegistration,
)
from kraft.metadata.image_records import image_records, image_values
from kraft.metadata.isr_changes import alter_partition
from kraft.metadata.partition_change import (
    build_change,
    change_record,
    effective_min_isr,
    leave_change,
    target_state,
)
from kraft.metadata.store import SqliteImageStore
from kraft.observability.logging import _FIELDS_ATTR
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller_logic import CLUSTER, SESSION_MS, Harness

_ids = st.integers(min_value=1, max_value=5)


@st.composite
def _partitions(draw: st.DrawFn) -> PartitionRegistration:
    """Registrations in the shapes the rules produce: ISR and ELR disjoint subsets of the replicas."""
    replicas = tuple(draw(st.lists(_ids, min_size=1, max_size=4, unique=True)))
    isr = tuple(r for r in replicas if draw(st.booleans()))
    elr = tuple(r for r in replicas if r not in isr and draw(st.booleans()))
    lke = tuple(r for r in replicas if r not in isr and r not in elr and draw(st.booleans()))
    leader = draw(st.sampled_from((NO_PARTITION_LEADER, *isr)))
    epochs = draw(st.tuples(st.integers(0, 50), st.integers(0, 50)))
    return PartitionRegistration(replicas, isr, leader, *epochs, elr, lke)


@settings(max_examples=600, deadline=None)
@given(
    current=_partitions(),
    acceptable=st.sets(_ids),
    broker=_ids,
    min_isr=st.integers(1, 4),
    unclean_shutdown=st.booleans(),
    unclean_election=st.booleans(),
)
def test_elections_pick_only_eligible_leaders_and_keep_the_elr_consistent(
    current: PartitionRegistration,
    acceptable: set[int],
    broker: int,
    min_isr: int,
    unclean_shutdown: bool,
    unclean_election: bool,
) -> None:
    gone = (broker,) if unclean_shutdown else ()
    target = target_state(
        current,
        acceptable.__contains__,
        remove_from_isr=broker,
        min_isr=min_isr,
        unclean_shutdown=gone,
        unclean_election=unclean_election,
    )
    eligible = (set(current.isr) | set(current.elr)) - {broker if unclean_shutdown else -2}
    if target.leader != NO_PARTITION_LEADER:
        assert target.leader in acceptable and target.leader in target.isr
        if not target.unclean:
            assert target.leader in eligible  # from the ISR or the ELR, never another replica
        else:
            clean = target_state(
                current,
                acceptable.__contains__,
                remove_from_isr=broker,
                min_isr=min_isr,
                unclean_shutdown=gone,
            )
            assert unclean_election and clean.leader == NO_PARTITION_LEADER  # only where a clean one fails
            assert not any(r in acceptable for r in (*clean.isr, *clean.elr))
            assert target.isr == (target.leader,) and target.elr == () and target.leader_recovery_state == 1
    assert not set(target.isr) & set(target.elr)
    assert set(target.elr) <= eligible, "the ELR only ever loses members or takes them from the ISR"
    if unclean_shutdown:
        assert broker not in target.elr and (broker not in target.isr or target.leader == broker)
    if len(target.isr) >= effective_min_isr(min_isr, current.replicas):
        assert target.elr == () and target.last_known_elr == ()
    if not target.isr:
        # Empty only while someone stays eligible, or nobody eligible is left (an unclean shutdown took the
        # last one, or there never was one): then the partition waits for an unclean election.
        assert target.elr or not (eligible - set(gone)) or target.last_known_elr
        assert target.leader == NO_PARTITION_LEADER


@settings(max_examples=600, deadline=None)
@given(
    current=_partitions(),
    acceptable=st.sets(_ids),
    broker=_ids,
    min_isr=st.integers(1, 4),
    unclean_shutdown=st.booleans(),
    unclean_election=st.booleans(),
)
def test_leave_change_decides_as_build_change_with_elr(
    current: PartitionRegistration,
    acceptable: set[int],
    broker: int,
    min_isr: int,
    unclean_shutdown: bool,
    unclean_election: bool,
) -> None:
    expected = build_change(
        "T",
        0,
        current,
        acceptable.__contains__,
        remove_from_isr=broker,
        min_isr=min_isr,
        unclean_shutdown=(broker,) if unclean_shutdown else (),
        unclean_election=unclean_election,
    )
    got = leave_change(
        "T",
        0,
        current,
        acceptable.__contains__,
        broker,
        min_isr=min_isr,
        unclean_shutdown=unclean_shutdown,
        unclean_election=unclean_election,
    )
    if expected is None:
        assert got is None
        return
    assert got is not None
    record, registration = got
    assert record.partition_change == expected
    assert registration == _replayed(current, record)


def _memo_cases() -> list[tuple[PartitionRegistration, int, bool, bool]]:
    """Every (registration, min ISR, unclean shutdown, unclean election) over four replica lists sharing
    most members — each ISR subset, leader, an ELR or not, recovering or not, an unclean epoch or not —
    so pairs that differ in one thing only come back to back and in both orders over a memo."""
    cases = []
    for replicas in ((1, 2, 3), (1, 2), (1, 2, 4), (3, 2, 1)):
        for mask in range(1 << len(replicas)):
            isr = tuple(r for i, r in enumerate(replicas) if mask >> i & 1)
            outside = [r for r in replicas if r not in isr]
            for elr in ((), tuple(outside[:1])):
                for leader in (NO_PARTITION_LEADER, *isr):
                    for recovery, unclean_epoch in ((LEADER_RECOVERED, 0), (LEADER_RECOVERED, 7)):
                        current = PartitionRegistration(
                            replicas, isr, leader, 4, 5, elr, (), recovery, unclean_epoch
                        )
                        for min_isr in (1, 2, 3):
                            for unclean_shutdown in (False, True):
                                for unclean_election in (False, True):
                                    cases.append((current, min_isr, unclean_shutdown, unclean_election))
    cases.append(
        (PartitionRegistration((1, 2, 3), (1, 2), 1, 4, 5, (), (), LEADER_RECOVERING), 1, False, False)
    )
    return cases


@pytest.mark.parametrize("broker", [1, 2, 3])
@pytest.mark.parametrize("acceptable", [set(), {1}, {2}, {3}, {4}, {1, 2}, {2, 3}, {3, 4}, {1, 2, 3, 4}])
def test_leave_change_with_a_memo_decides_as_without(acceptable: set[int], broker: int) -> None:
    """One memo across a job's partitions (issue #17, session 15): every case, in an order where each
    memo key is first filled by one case and then read by others, gets what it gets without the memo
    (which test_leave_change_decides_as_build_change_with_elr checks against build_change)."""
    memo: dict[tuple[tuple[int, ...], tuple[int, ...], int, int, bool], object] = {}
    cases = _memo_cases()
    for current, min_isr, unclean_shutdown, unclean_election in cases + cases[::-1]:
        args = ("T", 0, current, acceptable.__contains__, broker)
        expected = leave_change(
            *args, min_isr=min_isr, unclean_shutdown=unclean_shutdown, unclean_election=unclean_election
        )
        got = leave_change(
            *args,
            min_isr=min_isr,
            unclean_shutdown=unclean_shutdown,
            unclean_election=unclean_election,
            memo=memo,
        )
        assert (got is None) == (expected is None), current
        if got is not None and expected is not None:
            assert got[0] == expected[0], current
            assert got[1] == expected[1], current
            assert (got[1].isr is got[1].replicas) == (expected[1].isr is expected[1].replicas)


@settings(max_examples=600, deadline=None)
@given(
    current=_partitions(),
    acceptable=st.sets(_ids),
    min_isr=st.integers(1, 4),
    unclean_election=st.booleans(),
    recovering=st.booleans(),
    unordered=st.booleans(),
)
def test_build_change_fast_path_decides_as_the_full_rules(
    current: PartitionRegistration,
    acceptable: set[int],
    min_isr: int,
    unclean_election: bool,
    recovering: bool,
    unordered: bool,
) -> None:
    if recovering:
        current = current._replace(leader_recovery_state=1)
    if unordered:
        current = current._replace(isr=tuple(reversed(current.isr)))
    got = build_change(
        "T", 0, current, acceptable.__contains__, min_isr=min_isr, unclean_election=unclean_election
    )
    target = target_state(
        current, acceptable.__contains__, min_isr=min_isr, unclean_election=unclean_election
    )
    assert got == change_record("T", 0, current, target)


def _image_with(partition: PartitionRegistration) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="t", topic_id="T")))
    delta.replay(
        records.wrap(
            pb.PartitionRecord(
                topic_id="T",
                partition_id=0,
                replicas=partition.replicas,
                isr=partition.isr,
                leader=partition.leader,
                leader_epoch=partition.leader_epoch,
                partition_epoch=partition.partition_epoch,
                eligible_leader_replicas=partition.elr,
                last_known_elr=partition.last_known_elr,
                leader_recovery_state=partition.leader_recovery_state,
                last_unclean_leader_epoch=partition.last_unclean_leader_epoch,
            )
        )
    )
    return delta.apply()


def _replayed(current: PartitionRegistration, record: pb.MetadataRecord) -> PartitionRegistration:
    delta = MetadataDelta(_image_with(current))
    delta.replay(records.decode_value(records.encode_value(record)))
    replayed = delta.apply().partition("T", 0)
    assert replayed is not None
    return replayed


@settings(max_examples=200, deadline=None)
@given(current=_partitions(), recovering=st.booleans(), unclean_epoch=st.integers(0, 1 << 20))
def test_the_new_fields_survive_replay_snapshot_records_and_the_image_store(
    current: PartitionRegistration, recovering: bool, unclean_epoch: int
) -> None:
    if recovering:
        current = current._replace(leader_recovery_state=1)
    current = current._replace(last_unclean_leader_epoch=unclean_epoch)
    image = _image_with(current)
    assert image.partition("T", 0) == current
    # a snapshot (image_records / image_values, byte for byte) replays to the same partition
    encoded = list(image_values(image))
    assert encoded == [records.encode_value(r) for r in image_records(image)]
    delta = MetadataDelta(MetadataImage.empty())
    for value in encoded:
        delta.replay(records.decode_value(value))
    assert delta.apply().partition("T", 0) == current


def test_metadata_dump_shows_the_new_fields() -> None:
    change = pb.PartitionChangeRecord(topic_id="T", partition_id=0, leader=3, leader_recovery_state=1)
    change.isr.ids.append(3)
    change.eligible_leader_replicas.SetInParent()
    shown = records.describe_value(records.encode_value(records.wrap(change)))["data"]
    assert shown["eligible_leader_replicas"] == {"ids": []} and shown["leader_recovery_state"] == 1
    partition = pb.PartitionRecord(
        topic_id="T", replicas=[1, 2, 3], leader=-1, eligible_leader_replicas=[1, 2]
    )
    shown = records.describe_value(records.encode_value(records.wrap(partition)))["data"]
    assert shown["eligible_leader_replicas"] == [1, 2] and shown["last_known_elr"] == []


def test_the_image_store_keeps_elr_rows_and_drops_them_when_they_clear(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "store.sqlite"
        store = await SqliteImageStore.open(path, clock=ManualClock())
        with_elr = _image_with(PartitionRegistration((1, 2, 3), (), -1, 4, 5, (1, 3), (2,), 0))
        await store.save(with_elr)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        loaded = await store.load()
        assert store.discarded is None
        assert loaded.partition("T", 0) == with_elr.partition("T", 0)
        # the ELR clears (the ISR is back at min ISR): the row goes, the checksum still verifies
        delta = MetadataDelta(loaded)
        change = pb.PartitionChangeRecord(topic_id="T", partition_id=0, leader=1)
        change.isr.ids.extend([1, 3])
        change.eligible_leader_replicas.SetInParent()
        change.last_known_elr.SetInParent()
        delta.replay(records.wrap(change))
        cleared = delta.apply()
        await store.save(cleared)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        again = await store.load()
        assert store.discarded is None
        partition = again.partition("T", 0)
        assert partition is not None and partition.elr == () and partition.last_known_elr == ()
        assert partition == cleared.partition("T", 0)
        await store.close()

    asyncio.run(scenario())


def test_the_last_unclean_leader_epoch_is_kept_by_every_later_change_and_set_only_when_present() -> None:
    image = _image_with(PartitionRegistration((1, 2, 3), (3,), 3, 7, 7, last_unclean_leader_epoch=7))
    clean = pb.PartitionChangeRecord(topic_id="T", partition_id=0, leader=1)
    clean.isr.ids.extend([1, 3])
    current = image.partition("T", 0)
    assert current is not None
    after = _replayed(current, records.wrap(clean))
    assert (after.leader_epoch, after.last_unclean_leader_epoch) == (8, 7)  # absent = unchanged
    unclean = pb.PartitionChangeRecord(topic_id="T", partition_id=0, leader=2, last_unclean_leader_epoch=9)
    assert _replayed(after, records.wrap(unclean)).last_unclean_leader_epoch == 9
    shown = records.describe_value(records.encode_value(records.wrap(unclean)))["data"]
    assert shown["last_unclean_leader_epoch"] == 9  # kraft metadata dump shows it


def test_the_image_store_keeps_the_last_unclean_leader_epoch_and_discards_an_older_table(
    tmp_path: Path,
) -> None:
    """The marker alone (no ELR, RECOVERED) gets a partition_elr row; a store written before the column
    existed is discarded when opened (rebuilt from the log), never read without the marker."""

    async def scenario() -> None:
        path = tmp_path / "store.sqlite"
        store = await SqliteImageStore.open(path, clock=ManualClock())
        marked = _image_with(PartitionRegistration((1, 2, 3), (1,), 1, 6, 6, last_unclean_leader_epoch=5))
        await store.save(marked)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        loaded = await store.load()
        assert store.discarded is None
        partition = loaded.partition("T", 0)
        assert partition == marked.partition("T", 0) and partition is not None
        assert partition.last_unclean_leader_epoch == 5
        await store.close()
        # an older build's partition_elr (no last_unclean_leader_epoch column)
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("DROP TABLE partition_elr")
            db.execute(
                "CREATE TABLE partition_elr (topic_id TEXT NOT NULL, partition_id INTEGER NOT NULL,"
                " elr TEXT NOT NULL, last_known_elr TEXT NOT NULL, leader_recovery_state INTEGER NOT NULL,"
                " PRIMARY KEY (topic_id, partition_id)) WITHOUT ROWID"
            )
            db.commit()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        with contextlib.closing(sqlite3.connect(path)) as db:  # the file was started afresh
            columns = {row[1] for row in db.execute("PRAGMA table_info(partition_elr)")}
        assert "last_unclean_leader_epoch" in columns
        assert (await store.load()).offset == -1  # discarded: empty, rebuilt from the log
        await store.save(marked)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        assert (await store.load()).partition("T", 0) == marked.partition("T", 0)
        await store.close()

    asyncio.run(scenario())


# ---- the controller ----


def _harness_rf3_min2() -> tuple[Harness, str]:
    h = Harness()
    h.active_brokers(1, 2, 3)
    result = h.create(
        "t",
        partitions=-1,
        rf=-1,
        assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2, 3])],
        configs=[cpb.TopicConfig(name="min.insync.replicas", value="2")],
    )
    assert result.error_code == ErrorCode.NONE
    return h, h.image.topic_ids_by_name["t"]


def _partition(h: Harness, topic_id: str) -> PartitionRegistration:
    partition = h.image.partition(topic_id, 0)
    assert partition is not None
    return partition


def _expire(h: Harness, broker_id: int, *alive: int) -> None:
    """Let ``broker_id``'s session lapse while ``alive`` keep heartbeating: the controller fences it."""
    h.now_ms += SESSION_MS // 2
    for other in alive:
        h.heartbeat(other)
    h.now_ms += SESSION_MS // 2 + 1
    fenced, out = h.logic.fence_expired(h.now_ms, h.next_offset)
    h.commit(out)
    assert fenced == broker_id


def test_brokers_fenced_one_by_one_grow_the_elr_and_an_elr_member_returns_as_leader() -> None:
    h, topic_id = _harness_rf3_min2()
    assert _partition(h, topic_id)[:3] == ((1, 2, 3), (1, 2, 3), 1)
    _expire(h, 3, 1, 2)  # ISR 2 = min ISR: no ELR yet
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((1, 2), (), 1)
    _expire(h, 1, 2)  # below min ISR: 1 joins the ELR, 2 leads
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((2,), (1,), 2)
    _expire(h, 2)  # the whole ISR is gone: offline, both eligible
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((), (1, 2), NO_PARTITION_LEADER)
    assert p.last_known_elr == ()
    # 3 returns first: it left the ISR while it was at min ISR (it may lack committed records) — no leader
    h.heartbeat(3)
    assert not h.image.brokers[3].fenced
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((), (1, 2), NO_PARTITION_LEADER)
    # 1 (an ELR member, not the last ISR member) returns: elected from the ELR
    h.heartbeat(1)
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((1,), (2,), 1)
    # the leader adds 3 back once it caught up: ISR at min ISR clears the ELR
    response = h.run(alter_partition(h.logic, _isr_request(h, topic_id, 1, [1, 3]), h.next_offset))
    assert response.partitions[0].error_code == ErrorCode.NONE
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.last_known_elr, p.leader) == ((1, 3), (), (), 1)


def _isr_request(h: Harness, topic_id: str, leader: int, isr: list[int]) -> cpb.AlterPartitionRequest:
    p = _partition(h, topic_id)
    return cpb.AlterPartitionRequest(
        cluster_id=CLUSTER,
        broker_id=leader,
        broker_epoch=h.image.brokers[leader].epoch,
        partitions=[
            cpb.AlterPartitionRequest.PartitionData(
                topic_id=topic_id,
                partition=0,
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
                new_isr=[
                    cpb.AlterPartitionRequest.IsrMember(broker_id=b, broker_epoch=h.image.brokers[b].epoch)
                    for b in isr
                ],
            )
        ],
    )


def test_alter_partition_shrink_below_min_isr_fills_the_elr_and_expansion_empties_it() -> None:
    h, topic_id = _harness_rf3_min2()
    assert (
        h.run(alter_partition(h.logic, _isr_request(h, topic_id, 1, [1, 2]), h.next_offset))
        .partitions[0]
        .error_code
        == ErrorCode.NONE
    )
    assert _partition(h, topic_id).elr == ()  # at min ISR
    assert (
        h.run(alter_partition(h.logic, _isr_request(h, topic_id, 1, [1]), h.next_offset))
        .partitions[0]
        .error_code
        == ErrorCode.NONE
    )
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((1,), (2,), 1), "the member dropped below min ISR stays eligible"
    record = h.log[-1].partition_change
    assert list(record.eligible_leader_replicas.ids) == [2] and not record.HasField("leader")
    # 3 joins (it caught up): ISR back at min ISR, ELR cleared
    assert (
        h.run(alter_partition(h.logic, _isr_request(h, topic_id, 1, [1, 3]), h.next_offset))
        .partitions[0]
        .error_code
        == ErrorCode.NONE
    )
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((1, 3), (), 1)


def test_a_new_incarnation_that_cannot_name_its_predecessor_leaves_the_elr() -> None:
    """KIP-966's unclean shutdown, kraft's way: a registration not naming the registered incarnation as
    its predecessor (wiped or replaced log dirs) may have lost what it replicated."""
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    assert _partition(h, topic_id).elr == (1, 2)
    # 2 comes back on the same log dirs: it names its predecessor and stays eligible
    h.now_ms += 1
    again = cpb.RegisterBrokerRequest(
        cluster_id=CLUSTER,
        broker_id=2,
        incarnation_id="inc-2-b",
        previous_incarnation_id="inc-2",
        log_dirs=["/data"],
    )
    h.run(h.logic.register_broker(again, h.now_ms, h.next_offset))
    assert _partition(h, topic_id).elr == (1, 2)
    # 1 comes back with empty dirs (no predecessor to name): out of the ELR, into last_known_elr
    h.register(1, incarnation="inc-1-wiped")
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.last_known_elr, p.leader) == ((), (2,), (1,), NO_PARTITION_LEADER)
    h.heartbeat(1)  # unfenced: it is not eligible, the partition stays offline
    assert _partition(h, topic_id).leader == NO_PARTITION_LEADER
    h.heartbeat(2)
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((2,), (), 2)


def _reregister(
    h: Harness, broker_id: int, incarnation: str, previous: str, *earlier: str
) -> cpb.RegisterBrokerResponse:
    h.now_ms += 1
    request = cpb.RegisterBrokerRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        incarnation_id=incarnation,
        previous_incarnation_id=previous,
        earlier_incarnation_ids=list(earlier),
        log_dirs=["/data"],
    )
    return h.run(h.logic.register_broker(request, h.now_ms, h.next_offset))


def test_an_incarnation_naming_the_registered_one_among_earlier_predecessors_stays_in_the_elr() -> None:
    """Found by the replication sim (seed 3): a broker that crashed twice in a row, the second process
    before its registration reached the controller, runs on the same log dirs; its incarnation file's
    chain names the registered incarnation as an earlier predecessor (kraft.broker.incarnation)."""
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    assert _partition(h, topic_id).elr == (1, 2)
    # inc-2-b took over from inc-2 and died unregistered; inc-2-c took over from it
    assert _reregister(h, 2, "inc-2-c", "inc-2-b", "inc-2").error_code == ErrorCode.NONE
    assert h.image.brokers[2].incarnation_id == "inc-2-c"
    assert _partition(h, topic_id).elr == (1, 2)
    # a chain that names only processes the controller never held proves nothing: out of the ELR
    assert _reregister(h, 1, "inc-1-c", "inc-1-b", "inc-1-a").error_code == ErrorCode.NONE
    p = _partition(h, topic_id)
    assert (p.elr, p.last_known_elr) == ((2,), (1,))
    h.heartbeat(2)
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((2,), (), 2)


def test_an_earlier_predecessor_also_proves_a_fast_takeover_of_a_live_session() -> None:
    """The DUPLICATE_BROKER_REGISTRATION bypass has the same proof: the registered process is gone."""
    h = Harness()
    h.active_brokers(1)
    duplicate = _reregister(h, 1, "inc-1-c", "inc-1-b", "someone-else")
    assert duplicate.error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    assert _reregister(h, 1, "inc-1-c", "inc-1-b", "someone-else", "inc-1").error_code == ErrorCode.NONE
    assert h.image.brokers[1].incarnation_id == "inc-1-c"


def test_a_late_registration_of_a_superseded_incarnation_is_refused() -> None:
    """Found by the replication sim (seed 48): inc-2-b's RegisterBroker, delayed on the network, arrives
    after its successor inc-2-c (which named it) registered; accepted, it would be an unclean
    re-registration and take broker 2 out of every ELR."""
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    assert _reregister(h, 2, "inc-2-c", "inc-2-b", "inc-2").error_code == ErrorCode.NONE
    epoch = h.image.brokers[2].epoch
    late = _reregister(h, 2, "inc-2-b", "inc-2")
    assert late.error_code == ErrorCode.INVALID_REGISTRATION
    assert (h.image.brokers[2].incarnation_id, h.image.brokers[2].epoch) == ("inc-2-c", epoch)
    assert _partition(h, topic_id).elr == (1, 2)
    # a newly active controller forgets (soft state): the same request is then an unclean re-registration
    h.logic.reset(h.image, h.now_ms)
    assert _reregister(h, 2, "inc-2-b", "inc-2").error_code == ErrorCode.NONE
    assert _partition(h, topic_id).elr == (1,)


def test_hostile_incarnation_chains_are_invalid_requests() -> None:
    from kraft.broker.incarnation import MAX_PREDECESSORS
    from kraft.metadata.request_limits import MAX_EARLIER_INCARNATION_IDS, MAX_INCARNATION_ID_CHARS

    assert MAX_PREDECESSORS - 1 <= MAX_EARLIER_INCARNATION_IDS  # what a broker sends always fits
    h = Harness()
    h.active_brokers(1)
    longest = [f"other-{i}" for i in range(MAX_EARLIER_INCARNATION_IDS)]
    assert _reregister(h, 1, "inc-1-b", "x", *longest, "inc-1").error_code == ErrorCode.INVALID_REQUEST
    assert _reregister(h, 1, "inc-1-b", "x", *longest).error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    too_long = "i" * (MAX_INCARNATION_ID_CHARS + 1)
    assert _reregister(h, 1, "inc-1-b", "x", too_long).error_code == ErrorCode.INVALID_REQUEST
    assert _reregister(h, 1, "inc-1-b", too_long).error_code == ErrorCode.INVALID_REQUEST
    assert _reregister(h, 1, too_long, "inc-1").error_code == ErrorCode.INVALID_REQUEST
    assert h.image.brokers[1].incarnation_id == "inc-1"


def test_the_describe_answer_carries_the_elr() -> None:
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    from kraft.metadata.controller_logic import describe_topic

    topic = h.image.topics_by_id[topic_id]
    [described] = describe_topic(h.image, topic, include_partitions=True).partitions
    assert list(described.isr) == [2] and list(described.eligible_leader_replicas) == [1]
    assert list(described.last_known_elr) == [] and described.leader_recovery_state == 0


# ---- the leader's high watermark (the broker side of KIP-966) ----


def test_a_leader_elected_alone_into_its_isr_starts_with_its_high_watermark_frozen() -> None:
    """Found by the replication sim: the constructor advances the HWM of a leader alone in its ISR, so
    min ISR must be known before that (an ELR leader would expose records other ELR members lack)."""
    from kraft.replication.leader_state import PartitionLeaderState
    from kraft.replication.types import LeaderAndIsr

    alone = LeaderAndIsr(3, 14, 14, (1, 2, 3), (3,))
    assert PartitionLeaderState(3, alone, leader_end_offset=9, high_watermark=5, now_ms=0).high_watermark == 9
    frozen = PartitionLeaderState(3, alone, leader_end_offset=9, high_watermark=5, now_ms=0, min_isr=2)
    assert frozen.high_watermark == 5


def test_the_high_watermark_is_frozen_while_the_isr_is_below_min_isr() -> None:
    """What makes an ELR member a safe leader: nothing a consumer could read is missing on it."""
    from kraft.replication.leader_state import PartitionLeaderState
    from kraft.replication.types import LeaderAndIsr

    state = PartitionLeaderState(
        1, LeaderAndIsr(1, 3, 7, (1, 2, 3), (1,)), leader_end_offset=5, high_watermark=5, now_ms=0
    )
    assert not state.set_min_isr(2)  # ISR [1] < 2: frozen
    assert not state.on_leader_end_offset(9)
    assert state.high_watermark == 5
    assert state.set_min_isr(5) is False  # capped at the replication factor (3): still below
    assert state.set_min_isr(1)  # lowered: the HWM catches up at once
    assert state.high_watermark == 9
    state.set_min_isr(2)
    assert not state.on_leader_end_offset(12) and state.high_watermark == 9
    # the ISR back at min ISR (metadata): the HWM moves again, bounded by the member's log end
    state.on_metadata(LeaderAndIsr(1, 4, 8, (1, 2, 3), (1, 2)), now_ms=1)
    state.on_follower_fetch(2, 11, 4, now_ms=2)
    assert state.high_watermark == 11


# ---- unclean.leader.election.enable (KIP-704 recovery) ----


def _unclean_harness() -> tuple[Harness, str]:
    """RF 3 on brokers 1-3, min ISR 2, unclean election on for the topic; 3 fenced first, then 1 and 2:
    the partition is offline with 1 and 2 eligible, 3 not."""
    h = Harness()
    h.active_brokers(1, 2, 3)
    result = h.create(
        "t",
        partitions=-1,
        rf=-1,
        assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2, 3])],
        configs=[
            cpb.TopicConfig(name="min.insync.replicas", value="2"),
            cpb.TopicConfig(name="unclean.leader.election.enable", value="true"),
        ],
    )
    assert result.error_code == ErrorCode.NONE
    topic_id = h.image.topic_ids_by_name["t"]
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    p = _partition(h, topic_id)
    assert (p.isr, p.elr, p.leader) == ((), (1, 2), NO_PARTITION_LEADER)
    return h, topic_id


def test_unclean_election_elects_a_live_non_isr_replica_recovering_then_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kraft.controller.elections")
    h, topic_id = _unclean_harness()
    h.heartbeat(3)  # only 3 is live: neither in the ISR nor eligible
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr, p.last_known_elr, p.leader_recovery_state) == (3, (3,), (), (), 1)
    record = h.log[-1].partition_change
    assert record.leader == 3 and record.leader_recovery_state == 1
    # the durable marker: the leader epoch this election gave the partition (followers may drop what
    # was committed before it)
    assert record.last_unclean_leader_epoch == p.leader_epoch == p.last_unclean_leader_epoch > 0
    [warning] = [r for r in caplog.records if "unclean_leader_elected" in r.getMessage()]
    fields = getattr(warning, _FIELDS_ATTR)
    assert fields["partition"] == "t-0" and fields["new_leader"] == 3
    assert (fields["old_isr"], fields["old_elr"]) == ([], [1, 2])
    # RECOVERING: the leader may not expand the ISR yet ...
    expand = _isr_request(h, topic_id, 3, [3, 1])
    expand.partitions[0].leader_recovery_state = 1
    assert h.run(alter_partition(h.logic, expand, h.next_offset)).partitions[0].error_code == (
        ErrorCode.INVALID_REQUEST
    )
    # ... it reports RECOVERED first (its ISR as it is)
    recovered = _isr_request(h, topic_id, 3, [3])
    assert (
        h.run(alter_partition(h.logic, recovered, h.next_offset)).partitions[0].error_code == ErrorCode.NONE
    )
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.leader_recovery_state) == (3, (3,), 0)
    assert 0 < p.last_unclean_leader_epoch < p.leader_epoch  # kept by the later (clean) change
    # a RECOVERED partition cannot go back
    back = _isr_request(h, topic_id, 3, [3])
    back.partitions[0].leader_recovery_state = 1
    assert h.run(alter_partition(h.logic, back, h.next_offset)).partitions[0].error_code == (
        ErrorCode.INVALID_REQUEST
    )


def test_unclean_election_waits_for_an_eligible_replica_when_one_is_live() -> None:
    h, topic_id = _unclean_harness()
    h.heartbeat(2)  # an ELR member: a clean election, nothing recovering
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr, p.leader_recovery_state) == (2, (2,), (1,), 0)
    assert p.last_unclean_leader_epoch == 0  # a clean election leaves no marker


def test_turning_unclean_election_on_elects_an_offline_partition_at_once() -> None:
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    h.heartbeat(3)
    assert _partition(h, topic_id).leader == NO_PARTITION_LEADER  # default: waits for 1 or 2
    from kraft.metadata.config_control import incremental_alter_configs

    alter = cpb.IncrementalAlterConfigsRequest(cluster_id=CLUSTER)
    item = alter.resources.add()
    item.resource.resource_type = 2  # TOPIC
    item.resource.resource_name = "t"
    item.configs.add(name="unclean.leader.election.enable", op=0, value="true")
    response = h.run(incremental_alter_configs(h.logic, alter, h.next_offset))
    assert all(r.error_code == ErrorCode.NONE for r in response.results)
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.leader_recovery_state) == (3, (3,), 1)
    assert p.last_unclean_leader_epoch == p.leader_epoch > 0


def test_a_recovering_leader_reports_recovered_before_it_expands() -> None:
    from kraft.replication.leader_state import PartitionLeaderState
    from kraft.replication.types import LeaderAndIsr

    partition = LeaderAndIsr(3, 5, 9, (1, 2, 3), (3,), leader_recovery_state=1)
    state = PartitionLeaderState(3, partition, leader_end_offset=4, high_watermark=4, now_ms=0)
    state.on_follower_fetch(1, 4, 5, now_ms=1)
    assert state.isr_expand_candidates() == frozenset()  # caught up, but RECOVERING
    assert state.recovery_report_needed()
    request = state.propose_isr(state.isr)
    assert request.new_isr_ids == (3,) and request.leader_recovery_state == 0
    assert not state.recovery_report_needed()  # in flight
    state.on_metadata(LeaderAndIsr(3, 6, 10, (1, 2, 3), (3,)), now_ms=2)  # RECOVERED committed
    state.on_follower_fetch(1, 4, 6, now_ms=3)
    assert state.isr_expand_candidates() == frozenset({1})


# ---- ElectLeaders with election_type UNCLEAN (kafka-leader-election.sh --election-type unclean) ----


def _elect(
    h: Harness, election_type: int, *partitions: tuple[str, int]
) -> tuple[cpb.ElectLeadersResponse, list[pb.MetadataRecord]]:
    request = cpb.ElectLeadersRequest(cluster_id=CLUSTER, election_type=election_type)
    for topic, partition in partitions:
        request.topic_partitions.add(topic=topic, partitions=[partition])
    out = h.logic.elect_leaders(request, h.next_offset)
    return h.run(out), out.records


def _result(response: cpb.ElectLeadersResponse) -> list[tuple[str, int, ErrorCode]]:
    return [
        (group.topic, r.partition, ErrorCode(r.error_code))
        for group in response.topics
        for r in group.partitions
    ]


def _offline_rf3_min2() -> tuple[Harness, str]:
    """RF 3, min ISR 2, unclean.leader.election.enable left false: 3, then 1, then 2 fenced — offline
    with 1 and 2 eligible; then 3 returns (not eligible: no clean leader)."""
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    h.heartbeat(3)
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr) == (NO_PARTITION_LEADER, (), (1, 2))
    return h, topic_id


def test_an_unclean_election_request_elects_a_live_replica_whatever_the_topic_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kraft.controller.elections")
    h, topic_id = _offline_rf3_min2()
    response, records_ = _elect(h, 0, ("t", 0))  # preferred: 1 is not live
    assert _result(response) == [("t", 0, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)] and records_ == []
    response, records_ = _elect(h, 1, ("t", 0))
    assert _result(response) == [("t", 0, ErrorCode.NONE)] and response.election_type == 1
    [record] = records_
    assert record.partition_change.leader == 3 and record.partition_change.leader_recovery_state == 1
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr, p.last_known_elr, p.leader_recovery_state) == (3, (3,), (), (), 1)
    # set with the config off too: a returning replica may drop what was committed before this epoch
    assert record.partition_change.last_unclean_leader_epoch == p.leader_epoch == p.last_unclean_leader_epoch
    assert p.leader_epoch > 0
    [warning] = [r for r in caplog.records if "unclean_leader_elected" in r.getMessage()]
    fields = getattr(warning, _FIELDS_ATTR)
    assert (fields["partition"], fields["new_leader"], fields["old_elr"]) == ("t-0", 3, [1, 2])
    # led now: a second request has nothing to do and is no failure
    response, records_ = _elect(h, 1, ("t", 0))
    assert _result(response) == [("t", 0, ErrorCode.ELECTION_NOT_NEEDED)] and records_ == []


def test_an_unclean_election_request_elects_an_eligible_replica_cleanly_when_one_is_live(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kraft.controller.elections")
    h, topic_id = _offline_rf3_min2()
    # ELR member 2 unfenced behind the controller's back (a new active controller's image): the
    # partition is leaderless although an eligible replica is live
    delta = MetadataDelta(h.image)
    delta.replay(records.wrap(pb.UnfenceBrokerRecord(id=2, epoch=h.image.brokers[2].epoch)), h.next_offset)
    h.commit([records.wrap(pb.UnfenceBrokerRecord(id=2, epoch=h.image.brokers[2].epoch))])
    h.logic.reset(delta.apply(), h.now_ms)
    response, records_ = _elect(h, 1, ("t", 0))
    assert _result(response) == [("t", 0, ErrorCode.NONE)]
    assert [r.partition_change.leader for r in records_] == [2]
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr, p.leader_recovery_state) == (2, (2,), (1,), 0)  # clean: RECOVERED
    assert p.last_unclean_leader_epoch == 0 and not records_[0].partition_change.HasField(
        "last_unclean_leader_epoch"
    )
    assert not [r for r in caplog.records if "unclean_leader_elected" in r.getMessage()]


def test_an_unclean_election_without_a_live_replica_is_eligible_leaders_not_available() -> None:
    h, topic_id = _offline_rf3_min2()
    _expire(h, 3)
    assert all(h.image.brokers[b].fenced for b in (1, 2, 3))
    before = _partition(h, topic_id)
    response, records_ = _elect(h, 1, ("t", 0))
    assert _result(response) == [("t", 0, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)]
    assert ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE.value == 83  # Kafka's number
    assert records_ == [] and _partition(h, topic_id) == before


def test_an_implicit_unclean_election_lists_only_leaderless_partitions_and_repeats_are_one() -> None:
    h, _ = _offline_rf3_min2()
    assert h.create("healthy", rf=1).error_code == ErrorCode.NONE  # led by 3, the live broker
    response, records_ = _elect(h, 1)
    assert _result(response) == [("t", 0, ErrorCode.NONE)] and len(records_) == 1
    h2, _ = _offline_rf3_min2()
    response, records_ = _elect(h2, 1, ("t", 0), ("t", 0))  # named twice: one election, two results
    assert _result(response) == [("t", 0, ErrorCode.NONE)] * 2 and len(records_) == 1


def test_an_unknown_election_type_is_an_invalid_request() -> None:
    h, _ = _offline_rf3_min2()
    response, records_ = _elect(h, 2, ("t", 0))
    assert response.error_code == ErrorCode.INVALID_REQUEST and records_ == []
    assert not response.topics


def test_unclean_requests_are_bounded_like_preferred_ones() -> None:
    h, _ = _offline_rf3_min2()
    from kraft.metadata.request_limits import RequestLimits

    h.logic.settings = dataclasses.replace(
        h.logic.settings, request_limits=RequestLimits(max_topics=1, max_partitions=1)
    )
    response, records_ = _elect(h, 1, ("t", 0), ("t", 0))
    assert response.error_code == ErrorCode.POLICY_VIOLATION and records_ == []


def test_the_fast_path_runs_an_unclean_election_of_a_leaderless_partition_with_a_dead_isr() -> None:
    # Found by the fast-path property test: the only ISR member is not acceptable, the partition has no
    # leader, unclean elections are allowed — the fast path returned "no change" instead of electing 1.
    current = PartitionRegistration((1, 2, 3, 4), (4,), NO_PARTITION_LEADER, 0, 0, (), (), 0)
    change = build_change("T", 0, current, {1}.__contains__, min_isr=1, unclean_election=True)
    assert change is not None and change.leader == 1 and change.leader_recovery_state == 1
    assert build_change("T", 0, current, {1}.__contains__, min_isr=1) is None


# ---- a changed min.insync.replicas clears the ELR at once (KIP-966, Kafka's ClearElrRecord) ----


def _alter_min_isr(h: Harness, kind: int, name: str, value: str | None) -> list[pb.MetadataRecord]:
    from kraft.metadata.config_control import incremental_alter_configs

    request = cpb.IncrementalAlterConfigsRequest(cluster_id=CLUSTER)
    item = request.resources.add()
    item.resource.resource_type = kind
    item.resource.resource_name = name
    config = item.configs.add(name="min.insync.replicas", op=0 if value is not None else 1)
    if value is not None:
        config.value = value
    out = incremental_alter_configs(h.logic, request, h.next_offset)
    response = h.run(out)
    assert [r.error_code for r in response.results] == [ErrorCode.NONE]
    return out.records


TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


def test_a_topic_min_isr_change_clears_its_elr_in_the_same_write() -> None:
    h, topic_id = _harness_rf3_min2()
    assert h.create("other", rf=1).error_code == ErrorCode.NONE
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr) == (2, (2,), (1,))
    written = _alter_min_isr(h, TOPIC_RESOURCE, "t", "3")
    # Kafka's one ClearElrRecord naming the topic, whatever its partition count
    assert [r.WhichOneof("record") for r in written] == ["config", "clear_elr"]
    assert written[1].clear_elr.topic_name == "t"
    after = _partition(h, topic_id)
    assert (after.leader, after.isr, after.elr, after.last_known_elr) == (2, (2,), (), ())
    # both epochs bumped, as the PartitionChangeRecord kraft wrote before bumped them
    assert (after.leader_epoch, after.partition_epoch) == (p.leader_epoch + 1, p.partition_epoch + 1)
    # a setting that changes nothing writes nothing, and nothing is left to clear anyway
    assert _alter_min_isr(h, TOPIC_RESOURCE, "t", "3") == []


def test_a_cluster_default_change_clears_the_elr_of_topics_without_their_own_value() -> None:
    h = Harness()
    h.active_brokers(1, 2, 3)
    _alter_min_isr(h, BROKER_RESOURCE, "", "2")
    replicas = [cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2, 3])]
    assert h.create("d", partitions=-1, rf=-1, assignments=replicas).error_code == ErrorCode.NONE
    own = [cpb.TopicConfig(name="min.insync.replicas", value="2")]
    assert h.create("o", partitions=-1, rf=-1, assignments=replicas, configs=own).error_code == 0
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    d, o = (h.image.topic_ids_by_name[n] for n in ("d", "o"))
    assert _partition(h, d).elr == (1,) and _partition(h, o).elr == (1,)
    written = _alter_min_isr(h, BROKER_RESOURCE, "", "3")
    assert [r.WhichOneof("record") for r in written] == ["config", "clear_elr"]
    assert written[1].clear_elr.topic_name == ""  # every topic without its own value
    assert _partition(h, d).elr == () and _partition(h, o).elr == (1,)  # o's minimum did not change
    # (a broker's own value is refused: test_config_control)
    # deleting the topic's own value moves it to the default: its ELR goes too
    written = _alter_min_isr(h, TOPIC_RESOURCE, "o", None)
    assert [r.WhichOneof("record") for r in written] == ["config", "clear_elr"]
    assert written[1].clear_elr.topic_name == "o"
    assert _partition(h, o).elr == ()


def test_an_offline_partition_loses_its_elr_and_last_known_elr_even_right_after_a_failover() -> None:
    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    # give the partition a last known ELR too (as an unclean shutdown of an ELR member would)
    shaped = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=0)
    shaped.eligible_leader_replicas.ids.extend([1])
    shaped.last_known_elr.ids.extend([2])
    delta = MetadataDelta(h.image)
    delta.replay(records.wrap(shaped), h.next_offset)
    h.commit([records.wrap(shaped)])
    h.logic.reset(delta.apply(), h.now_ms)  # a new active controller: its rejoin index is being rebuilt
    assert h.logic.rejoin_index.building
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (NO_PARTITION_LEADER, (), (1,), (2,))
    written = _alter_min_isr(h, TOPIC_RESOURCE, "t", "1")
    assert [r.WhichOneof("record") for r in written] == ["config", "clear_elr"]
    p = _partition(h, topic_id)
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (NO_PARTITION_LEADER, (), (), ())
    # as in Kafka: with its ELR gone the partition waits for an unclean election, not for 1
    h.heartbeat(1)
    assert _partition(h, topic_id).leader == NO_PARTITION_LEADER
    response, _ = _elect(h, 1, ("t", 0))
    assert _result(response) == [("t", 0, ErrorCode.NONE)] and _partition(h, topic_id).leader == 1


def test_validate_only_clears_nothing() -> None:
    from kraft.metadata.config_control import incremental_alter_configs

    h, topic_id = _harness_rf3_min2()
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    request = cpb.IncrementalAlterConfigsRequest(cluster_id=CLUSTER, validate_only=True)
    item = request.resources.add()
    item.resource.resource_type = TOPIC_RESOURCE
    item.resource.resource_name = "t"
    item.configs.add(name="min.insync.replicas", op=0, value="3")
    out = incremental_alter_configs(h.logic, request, h.next_offset)
    assert out.records == [] and _partition(h, topic_id).elr == (1,)


def test_an_implicit_unclean_election_finds_every_leaderless_partition_right_after_a_failover() -> None:
    h = Harness()
    h.active_brokers(1, 2, 3)
    replicas = [cpb.ReplicaAssignment(partition=p, broker_ids=[1, 2, 3]) for p in range(3)]
    for name in ("a", "b"):
        assert h.create(name, partitions=-1, rf=-1, assignments=replicas).error_code == ErrorCode.NONE
    _expire(h, 3, 1, 2)
    _expire(h, 1, 2)
    _expire(h, 2)
    h.heartbeat(3)
    assert h.create("healthy", partitions=2, rf=1).error_code == ErrorCode.NONE  # led by 3
    h.logic.reset(h.image, h.now_ms)  # a new active controller: its rejoin index is being rebuilt
    assert h.logic.rejoin_index.building
    response, records_ = _elect(h, 1)
    expected = [(name, p, ErrorCode.NONE) for name in ("a", "b") for p in range(3)]
    assert _result(response) == expected and len(records_) == 6
    for name in ("a", "b"):
        for p in h.topic(name).partitions:
            assert (p.leader, p.isr, p.leader_recovery_state) == (3, (3,), 1)
