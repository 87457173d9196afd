"""The placement cursor of big and prepared topics' plans (issue #17): a plan made while earlier plans are
not written yet starts its placement after them (``ControllerLogic.planned_ahead``).  The count must be
exactly the partitions of the plans made and not yet checked for their write, refused or given up — a
plan refused while its explicit assignment is checked, or given up by its caller, used to stay counted
until the next failover and shifted every later topic's leaders.  A plan made while a big topic is
being written in slices starts after that topic's unwritten rest too (``ControllerLogic.written_ahead``):
it started at the image's count before, which holds only the slices written so far.  Small topics created
in one event (``create_topics``) start their placement at the same point: after the plans made before them
and a big topic's unwritten rest."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter

from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kraft.clock import Deadline, ManualClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.controller import ControllerOptions
from kraft.metadata.controller_logic import (
    ControllerLogic,
    ControllerSettings,
    TopicPlan,
    TopicTransactionBusy,
)
from kraft.metadata.image import MetadataImage
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import CLUSTER, activate_broker, settle
from .test_partition_reservations import SLICE, _logic
from .test_sliced_topics import _assigned, _rotating
from .test_work_budget import _cluster_with_a_topic, _started, unfenced_brokers


def _request(topic: cpb.CreatableTopic, validate_only: bool = False) -> cpb.CreateTopicsRequest:
    return cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic], validate_only=validate_only)


def _auto(name: str, partitions: int) -> cpb.CreatableTopic:
    return cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=2)


def _bad_explicit(name: str, partitions: int, bad_entry: int) -> cpb.CreatableTopic:
    """An explicit assignment whose entry ``bad_entry`` names an unregistered broker: refused only when
    its slice is checked (TopicPlan.place_some), after the plan was made."""
    assignment = _rotating(partitions)
    assignment[bad_entry] = [1, 9]
    return _assigned(name, assignment)


def _plan(logic: ControllerLogic, request: cpb.CreateTopicsRequest, prepared: bool = False) -> TopicPlan:
    outcome, plan = logic.plan_topic(request, 0, prepared=prepared)
    assert plan is not None, outcome.response
    return plan


def _cursor(logic: ControllerLogic) -> int:
    """Where the next plan's placement starts with nothing planned ahead: the image's partitions."""
    partitions, _hosted = logic._placement_counts()
    return partitions


def test_a_plan_refused_while_its_explicit_assignment_is_checked_no_longer_counts_ahead() -> None:
    logic = _logic()
    _cluster_with_a_topic(logic, 3)
    refused = _plan(logic, _request(_bad_explicit("bad", 40, 25)))
    pending = _plan(logic, _request(_auto("pending", 30)))
    assert pending.start_index == _cursor(logic) + 40
    assert logic.planned_ahead == 70
    try:
        while not refused.place_some(Deadline(None, 0), SLICE):
            pass
    except KraftError as exc:
        assert exc.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    else:
        raise AssertionError("the unregistered broker was not refused")
    logic.check_planned_ahead([pending])
    # the next plan starts after the pending one only, as if the refused one had never been planned
    assert _plan(logic, _request(_auto("next", 30))).start_index == _cursor(logic) + 30


def test_a_plan_given_up_before_its_write_no_longer_counts_ahead() -> None:
    logic = _logic()
    _cluster_with_a_topic(logic, 3)
    given_up = _plan(logic, _request(_auto("given-up", 40)), prepared=True)
    dry = _plan(logic, _request(_auto("dry", 20), validate_only=True))
    assert logic.planned_ahead == 60
    given_up.release()  # what QuorumController._create_prepared_topic's finally does when cancelled
    dry.release()
    given_up.release()  # idempotent
    logic.check_planned_ahead([])
    assert _plan(logic, _request(_auto("next", 30))).start_index == _cursor(logic)


def test_a_plan_made_before_a_reset_uncounts_nothing_after_it() -> None:
    logic = _logic()
    _cluster_with_a_topic(logic, 3)
    old = _plan(logic, _request(_auto("old", 40)))
    logic.reset(logic.image, 0)  # a new term: pending plans are the old term's
    logic.check_planned_ahead([])
    new = _plan(logic, _request(_auto("new", 30)))
    old.release()  # the old term's caller gives up only now
    logic.check_planned_ahead([new])
    assert _plan(logic, _request(_auto("next", 11))).start_index == _cursor(logic) + 30


async def test_a_prepared_topic_cancelled_through_the_controller_no_longer_counts_ahead() -> None:
    """The caller's CreateTopics cancelled while its prepared topic is placed: the plan's partitions stop
    counting ahead (before the fix the next topic's leaders started 300 partitions further on)."""
    clock = ManualClock()
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000)
    _raft, controller = await _started(options, clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        logic = controller.state.logic
        assert logic is not None
        create = asyncio.create_task(controller.create_topics(_request(_auto("given-up", 300))))
        for _ in range(1000):
            await asyncio.sleep(0)
            if logic.planned_ahead:
                break
        assert logic.planned_ahead == 300 and not create.done()
        create.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await create
        await settle()
        logic.check_planned_ahead([])
    finally:
        await controller.stop()


def _unwritten(logic: ControllerLogic, plans: list[TopicPlan]) -> int:
    """Partitions of ``plans`` (big topics whose write was admitted) not in the image yet; a deleted
    one's count nothing (recomputed from the image, not from the logic's jobs)."""
    unwritten = 0
    for plan in plans:
        topic = logic.image.topic(plan.name)
        if topic is not None:
            unwritten += plan.partitions - len(topic.partitions)
    return unwritten


def _admit_write(logic: ControllerLogic, plan: TopicPlan, log: list[pb.MetadataRecord]) -> None:
    """Count the plan's placement whole, finish the big topic being written before it, and write its
    first slice."""
    while not plan.place_some(Deadline(None, 0), SLICE):
        pass
    while True:
        try:
            outcome = logic.create_planned_topic(plan, False, len(log))
            break
        except TopicTransactionBusy:
            log.extend(logic.continue_bulk_jobs(len(log)))
    assert outcome.response.topics[0].error_code == ErrorCode.NONE, outcome.response
    log.extend(outcome.records)
    plan.release()


def test_a_plan_made_during_a_big_topics_write_starts_after_its_unwritten_rest() -> None:
    logic = _logic()
    log = _cluster_with_a_topic(logic, 3)
    big = _plan(logic, _request(_auto("big-one", 45)))
    _admit_write(logic, big, log)
    log.extend(logic.continue_bulk_jobs(len(log)))  # a second slice
    written = _cursor(logic) - 3
    assert 0 < written < 45
    assert logic.planned_ahead == 0 and logic.written_ahead == 45 - written
    during = _plan(logic, _request(_auto("during", 30)))
    assert during.start_index == 3 + 45  # where it starts after the unsliced creation of big-one
    # a new active controller resuming the write counts the rest the same way
    logic.reset(logic.image, 0)
    assert logic.written_ahead == 45 - written
    assert _plan(logic, _request(_auto("resumed", 30))).start_index == 3 + 45
    # deleted mid-way: nothing of it is ahead any more
    deleted = logic.delete_topics(cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["big-one"]), len(log))
    log.extend(deleted.records)
    assert logic.written_ahead == 0
    assert _plan(logic, _request(_auto("after", 30))).start_index == _cursor(logic) + 30


def test_a_small_topic_created_during_plans_and_a_sliced_write_is_placed_after_them() -> None:
    """Before, a small topic started at the image's count: the same leaders as the pending plan's first
    partitions and the written topic's unwritten rest (both start there too)."""
    logic = _logic()
    log = _cluster_with_a_topic(logic, 3)
    big = _plan(logic, _request(_auto("big-one", 45)))
    _admit_write(logic, big, log)
    written = _cursor(logic) - 3
    assert 0 < written < 45
    pending = _plan(logic, _request(_auto("pending", 30)))
    assert pending.start_index == 3 + 45
    expected = logic._assignment_for(_auto("small", 4), 3 + 45 + 30)  # after both, unsliced
    assert expected != logic._assignment_for(_auto("small", 4), _cursor(logic))
    created = logic.create_topics(_request(_auto("small", 4)), len(log))
    assert created.response.topics[0].error_code == ErrorCode.NONE, created.response
    log.extend(created.records)
    topic = logic.image.topic("small")
    assert topic is not None
    assert [p.replicas for p in topic.partitions] == expected
    # the next plan starts after the small topic too
    assert _plan(logic, _request(_auto("next", 30))).start_index == 3 + 45 + 30 + 4


def _settings_unsliced() -> ControllerSettings:
    return ControllerSettings(CLUSTER, max_changes_per_write=10_000, max_event_time_ms=0)


@given(
    racks=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=2, max_size=7),
    topics=st.lists(
        st.tuples(st.integers(SLICE + 1, 60), st.integers(1, 3), st.integers(0, 6)), min_size=2, max_size=6
    ),
)
@settings(max_examples=60, deadline=None)
def test_plans_made_during_sliced_writes_place_as_the_creations_one_after_the_other(
    racks: list[str | None], topics: list[tuple[int, int, int]]
) -> None:
    """Each big topic is planned while the one before it is mid-write (after ``slices`` of its slices):
    every topic's replicas, and so every broker's replica and leader counts, equal those of the same
    topics created one after the other in one event each.  Before, each plan started at the image's
    count, which holds only the earlier topic's slices written so far: leaders piled up on the first
    brokers of the rotation instead of continuing it."""
    sliced = _logic()
    log = unfenced_brokers(sliced, racks)
    ids = (f"u-{i}" for i in itertools.count())
    unsliced = ControllerLogic(_settings_unsliced(), MetadataImage.empty(), 0, new_topic_id=lambda: next(ids))
    unsliced_log = unfenced_brokers(unsliced, racks)
    names = []
    for i, (partitions, wanted_factor, slices) in enumerate(topics):
        name = f"t{i}"
        names.append(name)
        factor = min(wanted_factor, len(racks))
        for _ in range(slices):  # the write before it goes on for a while
            log.extend(sliced.continue_bulk_jobs(len(log)))
        topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=factor)
        _admit_write(sliced, _plan(sliced, _request(topic)), log)
        created = unsliced.create_topics(_request(topic), len(unsliced_log))
        assert created.response.topics[0].error_code == ErrorCode.NONE
        unsliced_log.extend(created.records)
    while sliced.has_bulk_jobs():
        log.extend(sliced.continue_bulk_jobs(len(log)))
    replicas: Counter[int] = Counter()
    leaders: Counter[int] = Counter()
    expected_replicas: Counter[int] = Counter()
    expected_leaders: Counter[int] = Counter()
    for name in names:
        got, want = sliced.image.topic(name), unsliced.image.topic(name)
        assert got is not None and want is not None
        assert [p.replicas for p in got.partitions] == [p.replicas for p in want.partitions], name
        for partition in got.partitions:
            replicas.update(partition.replicas)
            leaders[partition.replicas[0]] += 1
        for partition in want.partitions:
            expected_replicas.update(partition.replicas)
            expected_leaders[partition.replicas[0]] += 1
    assert replicas == expected_replicas and leaders == expected_leaders


_KINDS = ("big", "prepared", "explicit", "bad-explicit", "dry-run", "duplicate-name")


class PlannedAheadModel(RuleBasedStateMachine):
    """Random sequences of plans (big, prepared, explicit, refused while checked, dry runs, a name that
    will be taken by its write), placing slices, cancellations, writes, small topics and resets: the
    count planned ahead always equals the partitions of the plans the model holds pending, recomputed,
    and every new plan starts exactly there."""

    def __init__(self) -> None:
        super().__init__()
        self.logic = _logic()
        self.log: list[pb.MetadataRecord] = _cluster_with_a_topic(self.logic, 3)
        self.pending: list[TopicPlan] = []  # planned; not checked for the write, refused or given up
        self.stale: list[TopicPlan] = []  # made before a reset (a caller of the old term may release them)
        self.validate_only: dict[int, bool] = {}
        self.prepared: dict[int, bool] = {}
        self.names = (f"t{i}" for i in itertools.count())
        self.taken: set[str] = set()  # written or being written: a new plan for one is refused at once
        self.writing: list[TopicPlan] = []  # big topics admitted for their write (maybe written whole)

    def _drop(self, plan: TopicPlan) -> None:
        self.pending.remove(plan)

    @rule(kind=st.sampled_from(_KINDS), partitions=st.integers(SLICE + 1, 45), data=st.data())
    def plan(self, kind: str, partitions: int, data: st.DataObject) -> None:
        name = next(self.names)
        free = [p for p in self.pending if p.name not in self.taken]
        if kind == "duplicate-name" and free:
            name = data.draw(st.sampled_from(free)).name  # refused at the later write's check
        if kind == "explicit":
            topic = _assigned(name, _rotating(partitions))
        elif kind == "bad-explicit":
            topic = _bad_explicit(name, partitions, data.draw(st.integers(0, partitions - 1)))
        else:
            topic = _auto(name, partitions)
        prepared = data.draw(st.booleans())
        expected_start = (
            _cursor(self.logic)
            + sum(p.partitions for p in self.pending)
            + _unwritten(self.logic, self.writing)
        )
        outcome, plan = self.logic.plan_topic(_request(topic, kind == "dry-run"), len(self.log), prepared)
        assert plan is not None, outcome.response
        assert plan.start_index == expected_start, (plan.start_index, expected_start)
        self.pending.append(plan)
        self.validate_only[id(plan)] = kind == "dry-run"
        self.prepared[id(plan)] = prepared

    def _place(self, plan: TopicPlan, whole: bool) -> bool:
        """One slice (or all) of the plan's placement; False when its explicit assignment was refused."""
        try:
            if self.prepared[id(plan)]:
                while not self.logic.prepare_some(plan, Deadline(None, 0), SLICE) and whole:
                    pass
            else:
                while not plan.place_some(Deadline(None, 0), SLICE) and whole:
                    pass
        except KraftError:
            event("refused while its explicit assignment was checked")
            self._drop(plan)
            return False
        return True

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def place_a_slice(self, data: st.DataObject) -> None:
        self._place(data.draw(st.sampled_from(self.pending)), whole=False)

    @precondition(lambda self: self.pending or self.stale)
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        plan = data.draw(st.sampled_from(self.pending + self.stale))
        plan.release()
        if plan in self.pending:
            self._drop(plan)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        plan = data.draw(st.sampled_from(self.pending))
        if not self._place(plan, whole=True):
            return
        logic = self.logic
        validate_only = self.validate_only[id(plan)]
        if self.prepared[id(plan)]:
            outcome = logic.create_prepared_topic(plan, validate_only, len(self.log))
        else:
            while True:
                try:
                    outcome = logic.create_planned_topic(plan, validate_only, len(self.log))
                    break
                except TopicTransactionBusy:  # another big topic is being written: finish it first
                    self.finish_bulk_jobs()
        self._drop(plan)  # checked for its write: written, or refused by the check
        refused = outcome.response.topics[0].error_code != ErrorCode.NONE
        if not refused and not validate_only:
            self.taken.add(plan.name)
            if not self.prepared[id(plan)]:
                self.writing.append(plan)
        event("refused at its write's check" if refused else "checked for its write")
        self.log.extend(outcome.all_records())  # (a prepared topic's values, decoded)
        plan.release()  # the shell's finally

    @rule()
    def finish_bulk_jobs(self) -> None:
        while self.logic.has_bulk_jobs():
            self.log.extend(self.logic.continue_bulk_jobs(len(self.log)))

    @rule(partitions=st.integers(1, 5))
    def small_topic(self, partitions: int) -> None:
        """Placed where the next plan would start: after every pending plan and unwritten rest."""
        topic = _auto(next(self.names), partitions)
        start = (
            _cursor(self.logic)
            + sum(p.partitions for p in self.pending)
            + _unwritten(self.logic, self.writing)
        )
        expected = self.logic._assignment_for(topic, start)
        outcome = self.logic.create_topics(_request(topic), len(self.log))
        self.log.extend(outcome.records)
        if outcome.response.topics[0].error_code == ErrorCode.NONE:
            created = self.logic.image.topic(topic.name)
            assert created is not None
            assert [p.replicas for p in created.partitions] == expected

    @rule()
    def failover(self) -> None:
        self.logic.reset(self.logic.image, 0)  # every record here counts as committed
        self.stale.extend(self.pending)
        self.pending.clear()
        # an explicit assignment's write is not resumed (undone; the client's retry plans it anew), so
        # its rest is ahead of nothing any more
        self.writing = [p for p in self.writing if not p.explicit]

    @invariant()
    def counted_exactly(self) -> None:
        self.logic.check_planned_ahead(self.pending)
        assert self.logic.planned_ahead == sum(p.partitions for p in self.pending)


PlannedAheadModel.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestPlannedAheadModel = PlannedAheadModel.TestCase
