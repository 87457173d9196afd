"""KIP-966's unclean shutdown survives a controller failover (issue #16's follow-up).

A broker that re-registers as an incarnation that cannot name the registered one (its log dirs may be
wiped) must leave every ISR and every ELR before it is unfenced.  That removal is a sliced bulk job; the
fact that it is unclean used to live only in the active controller's memory, so a new active controller
resumed it as a clean one (or not at all) and the broker stayed in the ELRs not yet processed — electable
from there, with lost data, once unfenced.  The fact is now in the log (``RegisterBrokerRecord``'s
``unclean_shutdown``), kept in the image, snapshots and the image store, and cleared by the unfence.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.controller import ControllerOptions
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import NO_PARTITION_LEADER, MetadataImage
from kraft.metadata.image_records import image_records, image_values
from kraft.metadata.store import SqliteImageStore
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import activate_broker, registration, settle, started, until

CLUSTER = "c1"
PARTITIONS = 24
CHUNK = 3  # partition changes per write: the unclean job of 24 partitions takes 8+ writes


class Cluster:
    """A ControllerLogic with its log; ``commit`` appends what an event wrote, ``drain`` runs bulk jobs to
    the end (as the shell's job driver), ``failover`` is a new active controller on the committed log."""

    def __init__(self) -> None:
        self.now_ms = 1_000
        self.log: list[pb.MetadataRecord] = []
        ids = (f"topic-{i}" for i in itertools.count())
        self.logic = self._new_logic(MetadataImage.empty(), lambda: next(ids))
        self.commit(self.logic.bootstrap_records(0))

    def _new_logic(self, image: MetadataImage, new_id: Callable[[], str] | None = None) -> ControllerLogic:
        settings = ControllerSettings(
            CLUSTER, session_timeout_ms=60_000, max_changes_per_write=CHUNK, min_insync_replicas=2
        )
        return ControllerLogic(settings, image, self.now_ms, new_topic_id=new_id)

    @property
    def next_offset(self) -> int:
        return len(self.log)

    @property
    def image(self) -> MetadataImage:
        return self.logic.image

    def commit(self, written: list[pb.MetadataRecord]) -> None:
        self.log.extend(written)

    def drain(self) -> None:
        while self.logic.has_bulk_jobs():
            self.commit(self.logic.continue_bulk_jobs(self.next_offset))

    def committed(self) -> MetadataImage:
        """The image a node builds from the log, every record encoded and decoded as it is stored."""
        delta = MetadataDelta(MetadataImage.empty())
        for offset, record in enumerate(self.log):
            delta.replay(records.decode_value(records.encode_value(record)), offset)
        assert not delta.replay_errors
        return delta.apply()

    def failover(self) -> None:
        """What Activation does: a logic on the committed image (resuming what the image says)."""
        self.logic = self._new_logic(self.committed())

    def register(self, broker_id: int, incarnation: str, previous: str = "") -> cpb.RegisterBrokerResponse:
        self.now_ms += 1
        request = cpb.RegisterBrokerRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            incarnation_id=incarnation,
            previous_incarnation_id=previous,
            listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
            log_dirs=["/data"],
        )
        outcome = self.logic.register_broker(request, self.now_ms, self.next_offset)
        self.commit(outcome.records)
        return outcome.response

    def heartbeat(self, broker_id: int, want_fence: bool = False) -> cpb.BrokerHeartbeatResponse:
        self.now_ms += 1
        request = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=self.image.brokers[broker_id].epoch,
            current_metadata_offset=self.next_offset - 1,
            want_fence=want_fence,
        )
        outcome = self.logic.broker_heartbeat(request, self.now_ms, self.next_offset)
        self.commit(outcome.records)
        return outcome.response

    def partitions(self) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
        topic = self.image.topic("t")
        assert topic is not None
        return [(p.isr, p.elr, p.leader) for p in topic.partitions]


def _elr_two_everywhere() -> Cluster:
    """Brokers 1-3, topic t (24 partitions on 1, 2, 3, min ISR 2); 3 then 2 fenced: ISR (1,), ELR (2,)."""
    c = Cluster()
    for broker_id in (1, 2, 3):
        c.register(broker_id, f"inc-{broker_id}")
        c.drain()
    for broker_id in (1, 2, 3):
        assert not c.heartbeat(broker_id).is_fenced
        c.drain()
    topic = cpb.CreatableTopic(name="t")
    for p in range(PARTITIONS):
        topic.assignments.add(partition=p, broker_ids=[1, 2, 3])
    created = c.logic.create_topics(
        cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), c.next_offset
    )
    c.commit(created.records)
    for broker_id in (3, 2):
        c.heartbeat(broker_id, want_fence=True)
        c.drain()
    assert c.partitions() == [((1,), (2,), 1)] * PARTITIONS
    return c


def _leaders_from(log: list[pb.MetadataRecord]) -> Iterator[int]:
    for record in log:
        if record.WhichOneof("record") == "partition_change" and record.partition_change.HasField("leader"):
            yield record.partition_change.leader


def test_a_new_active_controller_finishes_an_unclean_registrations_elr_removal() -> None:
    c = _elr_two_everywhere()
    start = c.next_offset
    # broker 2 comes back on wiped dirs: it cannot name inc-2
    assert c.register(2, "inc-2-wiped").error_code == ErrorCode.NONE
    c.commit(c.logic.continue_bulk_jobs(c.next_offset))  # one more slice, then the controller is gone
    assert c.image.brokers[2].unclean_shutdown and c.image.brokers[2].fenced
    still_eligible = sum(1 for _, elr, _ in c.partitions() if 2 in elr)
    assert 0 < still_eligible < PARTITIONS, "the failover must fall in the middle of the job"

    c.failover()
    assert c.image.brokers[2].unclean_shutdown, "the flag is in the committed log"
    assert c.logic.has_bulk_jobs()
    # 2 is caught up, but its removal is not done: it stays fenced meanwhile
    assert c.heartbeat(2).is_fenced
    c.drain()
    assert all(2 not in elr and 2 not in isr for isr, elr, _ in c.partitions())
    assert not c.heartbeat(2).is_fenced
    assert not c.image.brokers[2].unclean_shutdown, "cleared by the unfence"
    # 1 goes: every partition is offline with 1 its only eligible leader; 2, unfenced, is never elected
    c.heartbeat(1, want_fence=True)
    c.drain()
    assert c.partitions() == [((), (1,), NO_PARTITION_LEADER)] * PARTITIONS
    assert 2 not in set(_leaders_from(c.log[start:]))
    # 1 returns: it leads again (it was in the ISR when it went)
    assert not c.heartbeat(1).is_fenced
    c.drain()
    assert c.partitions() == [((1,), (), 1)] * PARTITIONS


def test_a_failover_right_after_the_registration_resumes_the_whole_removal() -> None:
    """Even a new active controller that finds the registration and not one removal in the log (the
    first write's slice never committed, nor anything after) knows the broker must leave its ELRs."""
    c = _elr_two_everywhere()
    c.register(2, "inc-2-wiped")
    # keep only the registration (the fence it needed was done earlier): the rest is as if truncated
    registered = next(
        i for i in range(len(c.log) - 1, -1, -1) if c.log[i].WhichOneof("record") == "register_broker"
    )
    del c.log[registered + 1 :]
    c.failover()
    assert c.partitions() == [((1,), (2,), 1)] * PARTITIONS
    assert c.logic.has_bulk_jobs()
    c.drain()
    assert all(2 not in elr for _, elr, _ in c.partitions())


def test_a_successor_on_the_same_dirs_inherits_the_flag_until_the_unfence() -> None:
    """inc-2-wiped crashed before its unfence; inc-2-next names it (same dirs, the very same lost data):
    still unclean, and a failover after it still finishes the removal."""
    c = _elr_two_everywhere()
    c.register(2, "inc-2-wiped")
    assert c.register(2, "inc-2-next", previous="inc-2-wiped").error_code == ErrorCode.NONE
    assert c.image.brokers[2].unclean_shutdown
    c.commit(c.logic.continue_bulk_jobs(c.next_offset))
    assert any(2 in elr for _, elr, _ in c.partitions())
    c.failover()
    assert c.image.brokers[2].unclean_shutdown
    c.drain()
    assert all(2 not in elr for _, elr, _ in c.partitions())
    assert not c.heartbeat(2).is_fenced and not c.image.brokers[2].unclean_shutdown
    # a later clean restart (naming the unfenced incarnation) is clean again
    c.register(2, "inc-2-later", previous="inc-2-next")
    assert not c.image.brokers[2].unclean_shutdown


def test_a_clean_reregistration_carries_no_flag_and_stays_eligible() -> None:
    c = _elr_two_everywhere()
    c.register(2, "inc-2-b", previous="inc-2")
    c.drain()
    assert not c.image.brokers[2].unclean_shutdown
    c.failover()
    assert not c.logic.has_bulk_jobs()
    assert c.partitions() == [((1,), (2,), 1)] * PARTITIONS


def test_an_unregistration_cut_by_a_failover_leaves_the_broker_registered_and_a_retry_finishes() -> None:
    """The other sliced removal whose broker may have lost its data: its UnregisterBrokerRecord closes
    the job, so a failover in the middle leaves the registration (and its incarnation's proof) in place;
    the retried request, on the new controller, starts the removal again and unregisters it."""
    c = _elr_two_everywhere()
    request = cpb.UnregisterBrokerRequest(cluster_id=CLUSTER, broker_id=2)
    c.commit(c.logic.unregister_broker(request, c.next_offset).records)
    c.commit(c.logic.continue_bulk_jobs(c.next_offset))
    assert 0 < sum(1 for _, elr, _ in c.partitions() if 2 in elr) < PARTITIONS
    c.failover()
    assert 2 in c.image.brokers and not c.image.brokers[2].unclean_shutdown
    # still registered: a successor on wiped dirs would be an unclean registration (it cannot name it);
    # the retried unregistration removes the rest and then the registration itself
    c.commit(c.logic.unregister_broker(request, c.next_offset).records)
    c.drain()
    assert 2 not in c.image.brokers
    assert all(2 not in elr for _, elr, _ in c.partitions())


# ---- the flag in every form the image takes ----


def _flagged_image() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for broker_id, unclean in ((1, False), (2, True)):
        delta.replay(
            records.wrap(
                pb.RegisterBrokerRecord(
                    broker_id=broker_id,
                    incarnation_id=f"inc-{broker_id}",
                    broker_epoch=broker_id,
                    fenced=True,
                    log_dirs=["/data"],
                    unclean_shutdown=unclean,
                )
            ),
            broker_id,
        )
    delta.offset = 2
    return delta.apply()


def test_the_flag_survives_records_snapshots_and_the_image_store(tmp_path: Path) -> None:
    image = _flagged_image()
    assert image.brokers[2].unclean_shutdown and not image.brokers[1].unclean_shutdown
    # snapshot: image_records / image_values (byte for byte) replay to the same registrations
    encoded = list(image_values(image))
    assert encoded == [records.encode_value(r) for r in image_records(image)]
    delta = MetadataDelta(MetadataImage.empty())
    for value in encoded:
        delta.replay(records.decode_value(value))
    assert delta.apply().brokers == image.brokers
    # the metadata dump shows it
    shown = records.describe_value(encoded[-1])["data"]
    assert shown["unclean_shutdown"] is True

    async def stored() -> None:
        path = tmp_path / "store.sqlite"
        store = await SqliteImageStore.open(path, clock=ManualClock())
        await store.save(image)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        loaded = await store.load()
        assert store.discarded is None and loaded.brokers == image.brokers
        # cleared by the unfence, saved as a change of that row, still verified on load
        delta = MetadataDelta(loaded)
        delta.replay(records.wrap(pb.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, fenced=-1)))
        unfenced = delta.apply()
        assert not unfenced.brokers[2].unclean_shutdown and not unfenced.brokers[2].fenced
        await store.save(unfenced)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        again = await store.load()
        assert store.discarded is None and again.brokers == unfenced.brokers
        await store.close()
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT broker_id, unclean_shutdown FROM brokers ORDER BY 1").fetchall()
        assert rows == [(1, 0), (2, 0)]

    asyncio.run(stored())


def test_only_the_unfence_clears_the_flag() -> None:
    image = _flagged_image()
    for change, still in (
        (pb.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, fenced=1), True),
        (pb.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, in_controlled_shutdown=1), True),
        (pb.FenceBrokerRecord(id=2, epoch=2), True),
        (pb.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, fenced=-1), False),
        (pb.UnfenceBrokerRecord(id=2, epoch=2), False),
    ):
        delta = MetadataDelta(image)
        delta.replay(records.wrap(change))
        assert delta.apply().brokers[2].unclean_shutdown is still, change


def test_an_image_store_written_before_the_flag_is_discarded_once(tmp_path: Path) -> None:
    """An older build's store has no ``unclean_shutdown`` column (and may have replayed flagged records it
    could not keep): it is rebuilt from the log instead of loaded."""
    path = tmp_path / "store.sqlite"

    async def saved() -> None:
        store = await SqliteImageStore.open(path, clock=ManualClock())
        await store.save(_flagged_image())
        await store.close()

    asyncio.run(saved())
    with sqlite3.connect(path) as db:  # what the older build's table looked like (its rows, its columns)
        columns = "broker_id, epoch, incarnation_id, rack, fenced, in_controlled_shutdown, endpoints, "
        columns += "features, log_dirs"
        db.execute(f"CREATE TABLE older AS SELECT {columns} FROM brokers")
        db.execute("DROP TABLE brokers")
        db.execute("ALTER TABLE older RENAME TO brokers")

    async def reopened() -> None:
        store = await SqliteImageStore.open(path, clock=ManualClock())
        assert (await store.load()).offset == -1  # empty: the caller replays the log
        await store.save(_flagged_image())
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        assert (await store.load()).brokers[2].unclean_shutdown and store.discarded is None
        await store.close()

    asyncio.run(reopened())


# ---- the QuorumController: leadership lost in the middle of the job, regained ----


async def test_the_quorum_controller_resumes_an_unclean_removal_after_regaining_leadership() -> None:
    options = ControllerOptions(
        noop_interval_ms=0,
        session_timeout_ms=60_000,
        max_work_unit_records=2,
        max_uncommitted_bulk_records=2,
        min_insync_replicas=2,
    )
    raft, controller = await started(options)
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epochs = {b: await activate_broker(controller, b) for b in (1, 2, 3)}
        topic = cpb.CreatableTopic(name="t")
        for p in range(PARTITIONS):
            topic.assignments.add(partition=p, broker_ids=[1, 2, 3])
        await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]))
        for broker_id in (3, 2):
            await controller.broker_heartbeat(
                cpb.BrokerHeartbeatRequest(
                    cluster_id=CLUSTER,
                    broker_id=broker_id,
                    broker_epoch=epochs[broker_id],
                    current_metadata_offset=epochs[broker_id],
                    want_fence=True,
                )
            )

        def eligible_2() -> int:
            t = controller.committed.topic("t")
            return -1 if t is None else sum(1 for p in t.partitions if 2 in p.elr)

        await until(lambda: eligible_2() == PARTITIONS)
        await until(lambda: controller.writes.driver is None or controller.writes.driver.done())
        # registered (answered once its own records committed: a registration never waits for bulk work)
        wiped = controller.register_broker(registration(2, "inc-2-wiped"))
        assert (await asyncio.wait_for(wiped, 5)).error_code == ErrorCode.NONE
        for _ in range(1000):  # step the loop until part of the removal committed
            if 0 < eligible_2() < PARTITIONS:
                break
            await asyncio.sleep(0)
        assert 0 < eligible_2() < PARTITIONS and controller.committed.brokers[2].unclean_shutdown
        raft.hold_commits = True
        await settle()
        assert controller.writes.driver is not None and not controller.writes.driver.done()
        raft.lose_leadership(2)
        await until(lambda: not controller.is_active)
        remaining = eligible_2()
        assert 0 < remaining < PARTITIONS
        raft.hold_commits = False
        raft.elect()  # the same node wins again: a new activation on the committed image
        await until(lambda: controller.is_active and eligible_2() == 0)
        t = controller.committed.topic("t")
        assert t is not None and all(p.isr == (1,) and p.elr == () for p in t.partitions)
        assert controller.committed.brokers[2].fenced and controller.committed.brokers[2].unclean_shutdown
    finally:
        await controller.stop()
