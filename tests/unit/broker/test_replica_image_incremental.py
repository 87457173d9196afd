"""``ReplicaManager.on_image`` visits only what an image changed (issue #17): after random image sequences
its state equals that of a manager doing the full visit of every hosted partition per image (the code
before, kept here as :class:`FullVisit`), and its indexes equal their recomputation.  A third manager
builds every new state in loop turns (a stepped build from the first new partition on, one partition a
turn, later images applied while it runs): once its build is done it equals the others too, and while it
runs no partition without a state is led or fetched.

Two brokers-1 side by side, each with its own partition manager and in-memory logs, get the same
images; fetchers never get an answer (their transport waits), AlterPartition requests are refused with
INELIGIBLE_REPLICA (the proposal reverts and is made again with the next image, as KIP-704's recovery
report is) or applied as proposed.  Appends to led partitions move high watermarks, so min ISR changes
have something to hold and release."""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from pathlib import Path

from broker_fakes import MemoryLogOpener, SilentReplicaTransport, replayed
from google.protobuf.message import Message
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kraft.broker.image_adapter import local_assignments
from kraft.broker.partitions import Pacer, PartitionManager
from kraft.broker.replication import ReplicaManager, min_isr_topics
from kraft.broker.types import ProducedRecord, ReplicaRole, TopicPartition
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import records as rec
from kraft.metadata.image import MetadataImage
from kraft.observability.metrics import ReplicationMetrics
from kraft.replication.types import RECOVERED, RECOVERING
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

BROKER = 1
TOPICS = ("a", "b", "c")
MIN_ISR = "min.insync.replicas"
_examples = Counter[str]()


class FullVisit(ReplicaManager):
    """The code before: every image visits every hosted partition, re-applies every led partition's min
    ISR, looks at every led partition for a recovery report and recounts the gauges."""

    def on_image(self, image: MetadataImage) -> None:
        self._image = image
        self.check_lease()
        now_ms = self._clock.monotonic_ms()
        self._touched.clear()
        hosted = {p.tp: p for p in self._partitions.partitions()}
        for tp in [tp for tp, led in self._led.items() if hosted.get(tp) is not led.partition]:
            self._drop_led(tp, revisit=False)
        for tp in [tp for tp, f in self._followed.items() if hosted.get(tp) is not f.partition]:
            self._remove_followed(tp)
        for tp, partition in hosted.items():
            if partition.role is ReplicaRole.LEADER:
                followed = self._remove_followed(tp)
                self._lead(partition, now_ms, 0 if followed is None else followed.high_watermark)
            else:
                if tp in self._led:
                    self._drop_led(tp, revisit=False)
                self._follow(partition)
        for tp, led in self._led.items():
            if led.state.set_min_isr(self._min_insync_replicas(tp.topic)):
                self._high_watermark_advanced(led)
        for led in self._led.values():
            if led.state.recovery_report_needed():
                self._propose(led, led.state.isr)
        self._update_gauges()

    def _update_gauges(self) -> None:
        metrics = self.metrics
        under_replicated = under_min = at_min = 0
        for tp, led in self._led.items():
            isr = len(led.assignment.isr)
            if isr < len(led.assignment.replicas):
                under_replicated += 1
            min_isr = self._min_insync_replicas(tp.topic)
            if isr < min_isr:
                under_min += 1
            elif isr == min_isr:
                at_min += 1
        metrics.leader_count.set(len(self._led))
        metrics.partition_count.set(len(self._led) + len(self._followed))
        metrics.under_replicated_partitions.set(under_replicated)
        metrics.under_min_isr_partition_count.set(under_min)
        metrics.at_min_isr_partition_count.set(at_min)
        metrics.replica_fetcher_max_lag.set(
            max((self._follower_lag(f) for f in self._followed.values()), default=0)
        )


class Side:
    """One broker 1: partition manager, in-memory logs, replica manager; the proposals it sent."""

    def __init__(self, root: Path, kind: type[ReplicaManager], label: str, clock: ManualClock) -> None:
        self.manager = PartitionManager(BROKER, [root], MemoryLogOpener())
        self.manager.load()
        self.proposals: list[tuple[str, int, tuple[int, ...], int]] = []
        self.label = label
        self.replicas = kind(
            BROKER,
            "c-1",
            self.manager,
            clock=clock,
            broker_epoch=lambda: 7,
            send_alter_partition=self._send,
            metrics=ReplicationMetrics.for_node(label),
            transport=SilentReplicaTransport(),
        )

    async def _send(self, request: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
        """Refused (INELIGIBLE_REPLICA: proposed again with the next image) for odd partitions, applied
        as proposed for even ones (the leader's state says RECOVERED before the image does)."""
        (data,) = request.partitions
        isr = tuple(m.broker_id for m in data.new_isr)
        self.proposals.append((data.topic_id, data.partition, isr, data.leader_recovery_state))
        if data.partition % 2:
            return cpb.AlterPartitionResponse(error_code=ErrorCode.INELIGIBLE_REPLICA)
        applied = cpb.AlterPartitionResponse.PartitionResult(
            topic_id=data.topic_id, partition=data.partition, leader=BROKER, leader_epoch=data.leader_epoch,
            partition_epoch=data.partition_epoch, isr=isr,
        )  # fmt: skip
        return cpb.AlterPartitionResponse(partitions=[applied])

    def apply(self, image: MetadataImage) -> None:
        self.manager.reconcile(local_assignments(image, BROKER))
        self.replicas.on_image(image)

    def stepped(self) -> None:
        """Build every new state in loop turns (stepped), one partition a turn, yielding at every look."""
        self.replicas.stepped_build_min = 1
        self.replicas.build_step = 1
        self.replicas.build_pacer = _YieldingPacer
        # Nothing stored to read (in-memory logs): no worker-thread read before the first build, whose
        # finishing turn would vary from run to run (the example must replay the same).
        self.replicas._restored = {}

    def gauge(self, name: str) -> float:
        # Read from the manager's own gauge, not the registry: a registry collection walks every label
        # set the examples created, which made a long run slower with each example.
        value: float = getattr(self.replicas.metrics, name)._value.get()
        return value

    def snapshot(self) -> dict[str, object]:
        r = self.replicas
        led = {
            tp: (
                led.assignment,
                led.state.high_watermark,
                led.state.isr,
                led.state._min_isr,
                led.state.pending is None,
                led.state.partition.leader_recovery_state,
            )
            for tp, led in r._led.items()
        }
        followed = {
            tp: (f.leader, f.leader_epoch, f.high_watermark, f.stopped, f.retry_at_ms)
            for tp, f in r._followed.items()
        }
        gauges = {
            name: self.gauge(name)
            for name in (
                "leader_count",
                "partition_count",
                "under_replicated_partitions",
                "under_min_isr_partition_count",
                "at_min_isr_partition_count",
                "replica_fetcher_max_lag",
            )
        }
        fetchers = sorted(leader for leader, task in r._fetchers.items() if not task.done())
        return {
            "led": led,
            "followed": followed,
            "gauges": gauges,
            "fetchers": fetchers,
            "proposals": sorted(self.proposals),
        }


class _YieldingPacer(Pacer):
    """Yields the loop at every look, for several turns (a busy loop: a stepped build of a few partitions
    spans more turns than the test's settling, so later images come while it runs)."""

    def __init__(self) -> None:
        super().__init__(ManualClock(), 1)

    async def tick(self) -> None:
        self.pauses += 1
        for _ in range(8):
            await asyncio.sleep(0)


def check_building(side: Side) -> None:
    """While a stepped build runs: a hosted partition is led iff its leader state exists (leads() is
    what the service asks before serving), followed iff its follower state exists (the fetchers' shares
    are the follower states), and those still to build have neither."""
    r = side.replicas
    waiting = r._pending | r._taken
    for partition in side.manager.partitions():
        tp = partition.tp
        assert r.leads(partition) == (tp in r._led and r._led[tp].partition is partition)
        if tp in waiting:
            assert tp not in r._led and tp not in r._followed
        elif tp in r._led:
            assert partition.role is ReplicaRole.LEADER
    fetched = {tp for group in r._by_leader.values() for tp in group}
    assert fetched == set(r._followed)


def _same(stepped: Side, other: Side) -> None:
    """The stepped side's state against another side's: equal, except for the proposals — a state built
    after a later image proposes what that image still needs, so the stepped side proposes a subset of
    the other's (a recovery report the other made for an image the build skipped over is not made) —
    and fetchers compared for the leaders something is followed from (a partition removed before its
    turn never started the fetcher the other side started for it, and that one has nothing to fetch)."""

    def seen(side: Side) -> dict[str, object]:
        snapshot = side.snapshot()
        fetchers = snapshot["fetchers"]
        assert isinstance(fetchers, list)
        groups = side.replicas._by_leader
        return {**snapshot, "proposals": None, "fetchers": [f for f in fetchers if f in groups]}

    assert seen(stepped) == seen(other)
    assert set(stepped.proposals) <= set(other.proposals)


def check_indexes(r: ReplicaManager) -> None:
    """The incremental manager's indexes equal their recomputation from its states."""
    by_leader: dict[int, dict[TopicPartition, object]] = {}
    for tp, f in r._followed.items():
        by_leader.setdefault(f.leader, {})[tp] = f
    assert r._by_leader == by_leader
    by_topic: dict[str, dict[TopicPartition, object]] = {}
    for tp, led in r._led.items():
        by_topic.setdefault(tp.topic, {})[tp] = led
    assert r._led_by_topic == by_topic
    recovering = {tp for tp, led in r._led.items() if led.state.partition.leader_recovery_state == RECOVERING}
    assert set(r._recovering) == recovering
    assert all(led.counted is not None for led in r._led.values())
    for led in r._led.values():  # (a proposal's task that failed would hide what this test compares)
        task = led.alter_task
        assert task is None or not task.done() or task.cancelled() or task.exception() is None
    lags = [r._follower_lag(f) for f in r._followed.values()]
    assert r._lags.max(len(r._followed)) == max(lags, default=0)
    assert not r._touched and not r._revisit


class Cluster:
    """The metadata both sides see, changed by the operations the test draws."""

    def __init__(self) -> None:
        self.image = MetadataImage.empty()
        self.offset = 0
        self.next_topic_id = 0

    def replay(self, *payloads: Message) -> None:
        self.image = replayed(self.image, self.offset, payloads)
        self.offset += len(payloads)


def _operation(data: st.DataObject, cluster: Cluster) -> tuple[str, tuple[object, ...]] | str:
    """Records for one image (or "append": a record appended to a led partition)."""
    image = cluster.image
    existing = sorted(image.topic_ids_by_name)
    kind = data.draw(
        st.sampled_from(
            ["create", "remove", "change", "change", "change", "config", "default", "noop", "append"]
        )
    )
    if kind == "create" or (kind in ("remove", "change") and not existing):
        name = data.draw(st.sampled_from(TOPICS))
        cluster.next_topic_id += 1
        topic_id = f"{name}-{cluster.next_topic_id}"
        payloads: list[object] = []
        if name in image.topic_ids_by_name:
            payloads.append(mpb.RemoveTopicRecord(topic_id=image.topic_ids_by_name[name]))
        payloads.append(mpb.TopicRecord(name=name, topic_id=topic_id))
        for partition in range(data.draw(st.integers(1, 4))):
            replicas = data.draw(st.permutations([1, 2, 3]))[: data.draw(st.integers(1, 3))]
            isr = replicas[: data.draw(st.integers(1, len(replicas)))]
            payloads.append(
                mpb.PartitionRecord(
                    partition_id=partition,
                    topic_id=topic_id,
                    replicas=replicas,
                    isr=isr,
                    leader=isr[0],
                    leader_epoch=1,
                    partition_epoch=1,
                )
            )
        return "create", tuple(payloads)
    if kind == "remove":
        name = data.draw(st.sampled_from(existing))
        return "remove", (mpb.RemoveTopicRecord(topic_id=image.topic_ids_by_name[name]),)
    if kind == "change":
        name = data.draw(st.sampled_from(existing))
        topic = image.topic(name)
        assert topic is not None
        index = data.draw(st.integers(0, len(topic.partitions) - 1))
        registration = topic.partitions[index]
        replicas = list(registration.replicas)
        change = mpb.PartitionChangeRecord(topic_id=topic.topic_id, partition_id=index)
        what = data.draw(st.sampled_from(["leader", "isr", "recovering", "recovered", "none"]))
        if what == "leader":
            # (from the ISR, as the controller elects: a leader outside it is no valid image)
            change.leader = data.draw(st.sampled_from([*registration.isr, -1]))
        elif what == "isr":
            isr = [r for r in replicas if data.draw(st.booleans())] or replicas[:1]
            change.isr.ids.extend(isr)
            if registration.leader not in isr:
                change.leader = isr[0]
        elif what in ("recovering", "recovered"):
            change.leader_recovery_state = RECOVERING if what == "recovering" else RECOVERED
            if what == "recovering":
                change.isr.ids.extend(replicas[:1])
                change.leader = replicas[0]
        return "change", (change,)
    if kind in ("config", "default"):
        resource = data.draw(st.sampled_from(TOPICS)) if kind == "config" else ""
        resource_type = rec.ConfigResourceType.TOPIC if kind == "config" else rec.ConfigResourceType.BROKER
        value = data.draw(st.sampled_from(["1", "2", "3", None]))
        record = mpb.ConfigRecord(resource_type=resource_type, resource_name=resource, name=MIN_ISR)
        if value is not None:
            record.value = value
        return kind, (record,)
    if kind == "append":
        return "append"
    return "noop", (mpb.NoOpRecord(),)


def _events(r: ReplicaManager, snapshot: dict[str, object]) -> None:
    """What the sequences exercised (pytest --hypothesis-show-statistics)."""
    if snapshot["proposals"]:
        event("a recovery report was proposed")
    if any(led.state.high_watermark > 0 for led in r._led.values()):
        event("a high watermark advanced")
    if any(led.counted is not None and led.counted[1] == -1 for led in r._led.values()):
        event("a led partition below min ISR")
    if r._followed:
        event("partitions followed")


async def _run(data: st.DataObject, steps: int) -> None:
    clock = ManualClock(1_000)
    cluster = Cluster()
    with tempfile.TemporaryDirectory(prefix="replica-image-") as root:
        inc = Side(Path(root) / "inc", ReplicaManager, f"inc-image-test-{_examples['n']}", clock)
        full = Side(Path(root) / "full", FullVisit, f"full-image-test-{_examples['n']}", clock)
        stepped = Side(Path(root) / "stepped", ReplicaManager, f"stepped-image-test-{_examples['n']}", clock)
        stepped.stepped()
        _examples["n"] += 1
        try:
            for _ in range(steps):
                operation = _operation(data, cluster)
                if operation == "append":
                    led = sorted(inc.replicas._led)
                    if not led:
                        continue
                    tp = data.draw(st.sampled_from(led))
                    await stepped.replicas.wait_built()  # (no produce is admitted before its state exists)
                    for side in (inc, full, stepped):
                        partition = side.manager.get(tp)
                        assert partition is not None
                        partition.log.append_records([ProducedRecord(None, b"v", 0)], partition.leader_epoch)
                        side.replicas.on_appended(partition)
                else:
                    before = cluster.image
                    cluster.replay(*operation[1])
                    topics = min_isr_topics(before, cluster.image)
                    assert topics is None or topics <= set(TOPICS)
                    for side in (inc, full, stepped):
                        side.apply(cluster.image)
                clock.advance(10)
                for _ in range(data.draw(st.sampled_from([0, 1, 5]))):  # (the stepped side's turns)
                    check_building(stepped)
                    await asyncio.sleep(0)
                if data.draw(st.booleans()):  # else the next image comes while the stepped build runs
                    await stepped.replicas.wait_built()
                for _ in range(10):  # the flushes, proposals and their refusals run (a build's too)
                    await asyncio.sleep(0)
                check_indexes(inc.replicas)
                snapshot = inc.snapshot()
                assert snapshot == full.snapshot()
                _events(inc.replicas, snapshot)
                if stepped.replicas.building:
                    event("an image applied while a stepped build ran")
                    check_building(stepped)
                else:
                    # (a build that ended in the last turns proposed its recovery reports at its end, and
                    # a re-proposal of a refused one: their answers come in a few turns; the other sides
                    # are quiet by now, so waiting changes nothing of theirs)
                    for _ in range(10):
                        await asyncio.sleep(0)
                    check_indexes(stepped.replicas)
                    _same(stepped, inc)
            await stepped.replicas.wait_built()
            for _ in range(10):
                await asyncio.sleep(0)
            check_indexes(stepped.replicas)
            _same(stepped, inc)
        finally:
            await inc.replicas.close()
            await full.replicas.close()
            await stepped.replicas.close()
            # each example's series go with it: left in the registry, every later collection in this
            # process (another test's get_sample_value, a scrape) walked them all
            ReplicationMetrics.forget(inc.label)
            ReplicationMetrics.forget(full.label)
            ReplicationMetrics.forget(stepped.label)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_incremental_on_image_equals_a_full_visit_after_random_image_sequences(data: st.DataObject) -> None:
    asyncio.run(_run(data, steps=data.draw(st.integers(1, 25))))


def test_min_isr_topics_names_the_changed_topics_or_all_for_the_cluster_default() -> None:
    cluster = Cluster()
    cluster.replay(mpb.TopicRecord(name="a", topic_id="a-1"))
    empty = cluster.image
    assert min_isr_topics(empty, empty) == set()
    topic = rec.ConfigResourceType.TOPIC
    cluster.replay(mpb.ConfigRecord(resource_type=topic, resource_name="a", name=MIN_ISR, value="2"))
    one = cluster.image
    assert min_isr_topics(empty, one) == {"a"}
    cluster.replay(mpb.ConfigRecord(resource_type=topic, resource_name="a", name="retention.ms", value="1"))
    assert min_isr_topics(one, cluster.image) == set()  # another config of the topic: no min ISR change
    broker = rec.ConfigResourceType.BROKER
    cluster.replay(mpb.ConfigRecord(resource_type=broker, resource_name="1", name=MIN_ISR, value="3"))
    assert min_isr_topics(one, cluster.image) == set()  # a per-broker value is never used
    two = cluster.image
    cluster.replay(mpb.ConfigRecord(resource_type=broker, resource_name="", name=MIN_ISR, value="2"))
    assert min_isr_topics(two, cluster.image) is None
    three = cluster.image
    cluster.replay(mpb.RemoveTopicRecord(topic_id="a-1"))
    assert min_isr_topics(three, cluster.image) == {"a"}  # its configs went with it


async def test_a_leader_state_dropped_outside_an_image_is_set_up_again_by_the_next() -> None:
    clock = ManualClock(0)
    cluster = Cluster()
    with tempfile.TemporaryDirectory() as root:
        side = Side(Path(root), ReplicaManager, "dropped-image-test", clock)
        cluster.replay(
            mpb.TopicRecord(name="a", topic_id="a-1"),
            mpb.PartitionRecord(partition_id=0, topic_id="a-1", replicas=[1], isr=[1], leader=1),
        )
        side.apply(cluster.image)
        tp = TopicPartition("a", 0)
        assert side.replicas.leader_state(tp) is not None
        side.replicas._drop_led(tp)
        cluster.replay(mpb.NoOpRecord())
        side.apply(cluster.image)  # nothing about the partition changed, yet it is visited again
        assert side.replicas.leader_state(tp) is not None
        check_indexes(side.replicas)
        await side.replicas.close()
