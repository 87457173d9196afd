"""An implicit UNCLEAN ElectLeaders in parts (issue #17, session 13): each part one bounded event, the
parts' records and merged results those of the one-pass request — with dirty flags left by a bulk
delta, the rejoin index stale (rebuilt in slices by the parts), big topics read in windows, and a
failover half-way (the client's retry on a new controller ends in the one pass's image)."""

from __future__ import annotations

import dataclasses

import pytest

from kraft.clock import Deadline, ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import controller_logic as logic_module
from kraft.metadata import records
from kraft.metadata import rejoin_index as rejoin_module
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import (
    ControllerLogic,
    ControllerSettings,
    UncleanElectionScan,
    merge_election_parts,
)
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import NO_PARTITION_LEADER, MetadataImage
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER as SHELL_CLUSTER
from .test_controller import ENDPOINTS, activate_broker, until

CLUSTER = "c1"
UNCLEAN = 1
SIZES = {"a": 3, "big": 90, "b": 1, "c": 40, "d": 2}  # partitions per topic (scan order)


def _base() -> MetadataImage:
    """Brokers 1-4 (4 fenced); every partition led by its first replica, replicas rotating over 1-4."""
    delta = MetadataDelta(MetadataImage.empty())
    for broker_id in (1, 2, 3, 4):
        delta.replay(
            records.wrap(
                pb.RegisterBrokerRecord(
                    broker_id=broker_id,
                    broker_epoch=broker_id,
                    incarnation_id=f"inc-{broker_id}",
                    endpoints=[common_pb2.Endpoint(name="PLAINTEXT", host="h", port=9000 + broker_id)],
                    fenced=broker_id == 4,
                )
            )
        )
    for name, count in SIZES.items():
        delta.replay(records.wrap(pb.TopicRecord(name=name, topic_id=f"id-{name}")))
        for p in range(count):
            replicas = [1 + (p + k) % 4 for k in range(2)]
            delta.replay(
                records.wrap(
                    pb.PartitionRecord(
                        topic_id=f"id-{name}",
                        partition_id=p,
                        replicas=replicas,
                        isr=replicas,
                        leader=replicas[0],
                    )
                )
            )
    return delta.apply()


def _offline(p: int) -> bool:
    return p % 3 != 1


def _logic(max_changes: int, lazy: bool) -> ControllerLogic:
    """A logic whose image lost the leaders of about two thirds of the partitions in one bulk delta
    (``lazy``: left dirty in the rejoin index, as a fenced broker's bulk job leaves them), broker 3
    fenced in it too: a partition on 3 and 4 has no live replica (ELIGIBLE_LEADERS_NOT_AVAILABLE)."""
    base = _base()
    settings = ControllerSettings(CLUSTER, max_changes_per_write=max_changes)
    logic = ControllerLogic(settings, base, 1_000)
    index = logic.rejoin_index
    index.lazy_min_changes = 0 if lazy else 1 << 30
    index.rebuild(base.topics_by_id)
    delta = MetadataDelta(base)
    for name, count in SIZES.items():
        for p in range(count):
            if _offline(p):
                change = pb.PartitionChangeRecord(
                    topic_id=f"id-{name}",
                    partition_id=p,
                    leader=NO_PARTITION_LEADER,
                    isr=pb.BrokerIdList(ids=[]),
                )
                delta.replay(records.wrap(change))
    # broker 3 fenced too: partitions on (3, 4) only have no live replica
    delta.replay(records.wrap(pb.BrokerRegistrationChangeRecord(broker_id=3, broker_epoch=3, fenced=1)))
    image = delta.apply()
    index.advance(delta, image.topics_by_id)
    logic.image = image
    assert index.settling is lazy
    return logic


def _request() -> cpb.ElectLeadersRequest:
    return cpb.ElectLeadersRequest(cluster_id=CLUSTER, election_type=UNCLEAN)


def _run_parts(
    logic: ControllerLogic, scan: UncleanElectionScan, parts: int | None = None, stale_between: bool = False
) -> tuple[list[pb.MetadataRecord], cpb.ElectLeadersResponse]:
    """Parts until ``scan.done`` (or ``parts`` of them), as the shell queues them; each part's records
    are committed at once (the logic's image already holds them)."""
    out: list[pb.MetadataRecord] = []
    answer: cpb.ElectLeadersResponse | None = None
    offset = 0
    ran = 0
    while not scan.done and (parts is None or ran < parts):
        outcome = logic.elect_leaders(_request(), offset, scan)
        assert outcome.response.error_code == 0
        assert len(outcome.records) <= logic.settings.max_changes_per_write
        out.extend(outcome.records)
        offset += len(outcome.records)
        if answer is None:
            answer = outcome.response
        else:
            merge_election_parts(answer, outcome.response)
        ran += 1
        if stale_between and ran % 3 == 0:
            logic.rejoin_index.invalidate()  # a reset between parts: the next parts rebuild it in slices
        assert ran < 10_000
    assert answer is not None
    return out, answer


def _one_pass(lazy: bool) -> tuple[list[pb.MetadataRecord], cpb.ElectLeadersResponse, MetadataImage]:
    logic = _logic(1 << 30, lazy)
    outcome = logic.elect_leaders(_request(), 0)
    return outcome.records, outcome.response, logic.image


def _results(response: cpb.ElectLeadersResponse) -> list[tuple[str, list[tuple[int, int]]]]:
    return [(g.topic, [(r.partition, r.error_code) for r in g.partitions]) for g in response.topics]


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("window", [rejoin_module.UNSETTLED_WINDOW, 7])
@pytest.mark.parametrize("stale_between", [False, True])
def test_the_parts_give_the_one_pass_records_and_results(
    lazy: bool, window: int, stale_between: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rejoin_module, "UNSETTLED_WINDOW", window)
    monkeypatch.setattr(logic_module, "INDEX_SLICE_PARTITIONS", 30)  # a rebuild takes several parts
    want_records, want_response, want_image = _one_pass(lazy)
    elected = sum(1 for name, count in SIZES.items() for p in range(count) if _offline(p))
    assert len(want_records) > 60 and len(want_records) < elected  # some without a live replica
    codes = {r.error_code for g in want_response.topics for r in g.partitions}
    assert codes == {0, int(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)}
    assert [g.topic for g in want_response.topics] == list(SIZES)  # each topic once, in scan order

    logic = _logic(7, lazy)
    scan = UncleanElectionScan()
    got_records, got_response = _run_parts(logic, scan, stale_between=stale_between)
    assert got_records == want_records
    assert _results(got_response) == _results(want_response)
    assert scan.parts > len(want_records) // 7
    assert logic.image.topics_by_id == want_image.topics_by_id
    assert not logic.rejoin_index.settling or lazy  # nothing was settled by the parts themselves


def test_each_part_stops_at_the_event_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A time budget that is always spent: each part looks at one take of candidates (CHECK_EVERY)."""
    monkeypatch.setattr(logic_module, "CHECK_EVERY", 5)
    monkeypatch.setattr(Deadline, "expired", lambda self, reserve_ms=0.0: True)
    want_records, _, _ = _one_pass(True)
    logic = _logic(1 << 30, True)
    scan = UncleanElectionScan()
    looked = []
    while not scan.done:
        outcome = logic.elect_leaders(_request(), 0, scan)
        looked.append(len(outcome.records))
        assert len(outcome.records) <= 5
    assert sum(looked) == len(want_records) and len(looked) > len(want_records) // 5


@pytest.mark.parametrize("cut", [1, 4, 9])
def test_a_failover_half_way_and_the_clients_retry_end_in_the_one_pass_image(cut: int) -> None:
    """The active controller ran ``cut`` parts (all committed but the last), then lost leadership: the
    new one starts from the committed image with a fresh index and the client's retried request —
    every partition still leaderless is elected once, and the end state is the one pass's."""
    _, _, want_image = _one_pass(True)
    logic = _logic(7, True)
    before_last = logic.image
    scan = UncleanElectionScan()
    for _ in range(cut):
        before_last = logic.image
        _run_parts(logic, scan, parts=1)
    assert not scan.done
    successor = ControllerLogic(dataclasses.replace(logic.settings), before_last, 2_000)
    retry = UncleanElectionScan()
    records_, _ = _run_parts(successor, retry)
    elected = [(r.partition_change.topic_id, r.partition_change.partition_id) for r in records_]
    assert len(elected) == len(set(elected))
    assert successor.image.topics_by_id == want_image.topics_by_id
    # and a second retry finds nothing left to do
    again, answer = _run_parts(successor, UncleanElectionScan())
    assert again == [] and all(
        r.error_code == int(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)
        for g in answer.topics
        for r in g.partitions
    )


def test_a_new_logic_under_the_same_scan_starts_over() -> None:
    """A scan handed a different logic (this controller active again with a new one) starts from the
    beginning on it instead of reading the old index's iteration."""
    logic = _logic(7, True)
    scan = UncleanElectionScan()
    _run_parts(logic, scan, parts=2)
    other = ControllerLogic(dataclasses.replace(logic.settings), logic.image, 3_000)
    _run_parts(other, scan)
    _, _, want_image = _one_pass(True)
    assert other.image.topics_by_id == want_image.topics_by_id


async def test_through_the_controller_the_parts_answer_as_one_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shell (``QuorumController.elect_leaders``): an implicit UNCLEAN request runs as parts of a work
    unit (4 elections), each an event of the queue, the next queued from inside each; the answer merges
    them (a topic cut by two parts is one group) into the one-pass answer on the same image."""
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=600_000, max_work_unit_records=4)
    clock = ManualClock(0)
    raft = FakeRaft(1)
    controller = QuorumController(raft, SHELL_CLUSTER, ENDPOINTS, options, clock=clock)
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    try:
        epochs = {b: await activate_broker(controller, b) for b in (1, 2, 3)}
        topics = []
        for name, count in (("t", 13), ("u", 6), ("v", 2)):
            topic = cpb.CreatableTopic(name=name)
            for p in range(count):
                topic.assignments.add(partition=p, broker_ids=[1, 2] if name != "v" else [3, 1])
            topics.append(topic)
        await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=SHELL_CLUSTER, topics=topics))
        logic = controller.logic
        assert logic is not None

        async def beat(broker_id: int, fence: bool) -> None:
            request = cpb.BrokerHeartbeatRequest(
                cluster_id=SHELL_CLUSTER,
                broker_id=broker_id,
                broker_epoch=epochs[broker_id],
                current_metadata_offset=logic.image.offset,
                want_fence=fence,
            )
            await controller.broker_heartbeat(request)
            await until(lambda: not logic.has_bulk_jobs())

        await beat(1, True)  # 2 leads t and u alone
        await beat(2, True)  # t and u offline, ISR (2,)
        await beat(1, False)  # 1 back: in no ISR of t or u, so no clean election
        image = logic.image
        assert all(p.leader == NO_PARTITION_LEADER for t in ("t", "u") for p in image.topic(t).partitions)  # type: ignore[union-attr]
        request = cpb.ElectLeadersRequest(cluster_id=SHELL_CLUSTER, election_type=UNCLEAN)
        want = ControllerLogic(ControllerSettings(SHELL_CLUSTER), image, 0).elect_leaders(request, 0).response
        kinds: list[str] = []
        controller.writes.queue.observe(clock, lambda kind, _ms: kinds.append(kind), lambda: None)
        got = await controller.elect_leaders(request)
        assert got.error_code == 0
        assert _results(got) == _results(want)
        assert sorted(g.topic for g in got.topics) == ["t", "u"]  # each once (the image's topic order)
        assert kinds.count("elect-leaders") >= 19 // 4 + 1
        assert all(p.leader == 1 for t in ("t", "u") for p in logic.image.topic(t).partitions)  # type: ignore[union-attr]
    finally:
        await controller.stop()


def _many_settled_then_offline(settled: int) -> ControllerLogic:
    """``settled`` one-partition topics, each led, then topic "z" whose 3 partitions lost their leader
    and ISR (live replicas 2 and 3: an unclean election elects them); the rejoin index follows it."""
    delta = MetadataDelta(MetadataImage.empty())
    for broker_id in (1, 2, 3):
        delta.replay(
            records.wrap(
                pb.RegisterBrokerRecord(
                    broker_id=broker_id,
                    broker_epoch=broker_id,
                    incarnation_id=f"inc-{broker_id}",
                    endpoints=[common_pb2.Endpoint(name="PLAINTEXT", host="h", port=9000 + broker_id)],
                    fenced=False,
                )
            )
        )
    for t in range(settled):
        delta.replay(records.wrap(pb.TopicRecord(name=f"s{t}", topic_id=f"id-s{t}")))
        delta.replay(
            records.wrap(
                pb.PartitionRecord(topic_id=f"id-s{t}", partition_id=0, replicas=[1, 2], isr=[1, 2], leader=1)
            )
        )
    delta.replay(records.wrap(pb.TopicRecord(name="z", topic_id="id-z")))
    for p in range(3):
        delta.replay(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="id-z", partition_id=p, replicas=[2, 3], isr=[], leader=NO_PARTITION_LEADER
                )
            )
        )
    image = delta.apply()
    logic = ControllerLogic(ControllerSettings(CLUSTER, max_changes_per_write=1 << 30), image, 1_000)
    logic.rejoin_index.rebuild(image.topics_by_id)
    return logic


def test_a_part_reads_at_most_one_window_of_topics_with_nothing_unsettled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Session 14: the scan walks the topics map by a cursor, a window at a time; a window with nothing
    unsettled ends the part's take, and with the time budget spent, the part — so a long run of settled
    topics is read over many parts, never copied or walked in one."""
    monkeypatch.setattr(rejoin_module, "UNSETTLED_WINDOW", 7)
    monkeypatch.setattr(logic_module, "CHECK_EVERY", 5)
    monkeypatch.setattr(Deadline, "expired", lambda self, reserve_ms=0.0: True)
    settled = 70
    want = _many_settled_then_offline(settled).elect_leaders(_request(), 0)
    assert len(want.records) == 3
    logic = _many_settled_then_offline(settled)
    scan = UncleanElectionScan()
    got_records, got_response = _run_parts(logic, scan)
    assert got_records == want.records
    assert _results(got_response) == _results(want.response) == [("z", [(0, 0), (1, 0), (2, 0)])]
    assert scan.parts >= settled // 7  # one window of settled topics per part at most
