"""The writes of new partitions and the bulk slices append values encoded as they are built (session 18,
issue #17): byte for byte what the same writes appended when they built upb records and encoded them at
the append.

The reference is the same controller logic with every batch holding records (the path before session 18:
``_new_partitions``' and ``leave_change``'s upb records, ``encode_value`` at the append), run side by side
with the shipped one over one script — brokers fenced, small CreateTopics (auto-placed and explicit), a
big topic written in slices, CreatePartitions, a controlled shutdown in slices — comparing every write's
values and the images after it.  ``Outcome.records`` of a write of values decodes them.  Session 19: the
same for fences, unfences and an unregistration under any min ISR (every leave shape and the unfence's
elections, encoded from their decisions).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import Deadline
from kraft.metadata import controller_logic, partition_growth
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings, Outcome, _Batch
from kraft.metadata.image import MetadataImage
from kraft.metadata.partition_growth import create_partitions
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

CLUSTER = "c1"
BROKERS = 6
Step = tuple[list[bytes], list[list[bytes]]]
"""A request's write (its values) and the slices of the bulk jobs it started (each slice's values)."""


class _RecordsBatch(_Batch):
    """A batch that holds upb records whatever its caller asked (the reference path); its values are
    the records encoded at the end, as the append encoded them."""

    __slots__ = ()

    def __post_init__(self) -> None:
        _Batch.__post_init__(self)
        self.values = None

    def finish_values(self) -> list[bytes]:
        return [rec.encode_value(r) for r in self.finish()]


@contextmanager
def _upb_records() -> Iterator[None]:
    with (
        patch.object(controller_logic, "_Batch", _RecordsBatch),
        patch.object(partition_growth, "_Batch", _RecordsBatch),
    ):
        yield


class _Run:
    """One controller logic and its log (values), every write committed at once."""

    def __init__(self, max_changes: int, upb: bool, min_isr: int = 1, unclean: bool = False) -> None:
        ids = (f"topic-{i}" for i in itertools.count())
        self.upb = upb
        self.logic = ControllerLogic(
            ControllerSettings(
                CLUSTER,
                max_changes_per_write=max_changes,
                min_insync_replicas=min_isr,
                unclean_leader_election_enable=unclean,
            ),
            MetadataImage.empty(),
            0,
            new_topic_id=lambda: next(ids),
        )
        self.log: list[bytes] = []

    @contextmanager
    def _mode(self) -> Iterator[None]:
        if self.upb:
            with _upb_records():
                yield
        else:
            yield

    def write(self, outcome: Outcome[Any]) -> list[bytes]:
        values = (
            outcome.encoded()
            if outcome.values is not None
            else [rec.encode_value(r) for r in outcome.records]
        )
        self.log.extend(values)
        return values

    def bulk(self) -> list[list[bytes]]:
        """The bulk jobs' slices to the end, each slice's values."""
        slices = []
        with self._mode():
            while self.logic.has_bulk_jobs():
                more = self.logic.continue_bulk_values(len(self.log))
                self.log.extend(more)
                slices.append(more)
        return slices

    def step(self, name: str, *args: object) -> Step:
        """A request's write and the slices of the bulk jobs it started."""
        logic = self.logic
        with self._mode():
            if name == "create_partitions":
                (request,) = args
                assert isinstance(request, cpb.CreatePartitionsRequest)
                outcome: Outcome[Any] = create_partitions(logic, request, len(self.log))
            else:
                outcome = getattr(logic, name)(*args, len(self.log))
            values = self.write(outcome)
        return values, self.bulk()

    def big_topic(self, topic: cpb.CreatableTopic) -> Step:
        request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
        logic = self.logic
        with self._mode():
            assert logic.is_big_topic(topic)
            outcome, plan = logic.plan_topic(request, len(self.log))
            assert plan is not None, outcome.response
            while not plan.place_some(Deadline(None, 0), logic.settings.max_changes_per_write):
                pass
            first = logic.create_planned_topic(plan, False, len(self.log))
            assert first.response.topics[0].error_code == 0, first.response
            values = self.write(first)
        return values, self.bulk()


def _both(max_changes: int, min_isr: int = 1, unclean: bool = False) -> tuple[_Run, _Run]:
    runs = _Run(max_changes, True, min_isr, unclean), _Run(max_changes, False, min_isr, unclean)
    for run in runs:
        for broker_id in range(1, BROKERS + 1):
            register = cpb.RegisterBrokerRequest(
                cluster_id=CLUSTER, broker_id=broker_id, incarnation_id="i", rack=f"r{broker_id % 2}"
            )
            run.step("register_broker", register, 0)
            beat = cpb.BrokerHeartbeatRequest(
                cluster_id=CLUSTER,
                broker_id=broker_id,
                broker_epoch=run.logic.image.brokers[broker_id].epoch,
                current_metadata_offset=99,
            )
            run.step("broker_heartbeat", beat, 0)
    return runs


def _same(reference: _Run, shipped: _Run, got: tuple[Step, ...]) -> None:
    assert got[0] == got[1]
    assert shipped.log == reference.log
    assert shipped.logic.image.topics_by_id == reference.logic.image.topics_by_id


TOPICS = st.lists(
    st.one_of(
        st.tuples(st.integers(1, 8), st.integers(1, 3)),  # auto-placed: partitions, replication factor
        st.lists(st.permutations(range(1, BROKERS + 1)).map(lambda p: tuple(p[:3])), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(
    max_changes=st.integers(3, 12),
    fenced=st.sets(st.integers(1, BROKERS), max_size=2),
    topics=TOPICS,
    big=st.tuples(st.integers(1, 30), st.integers(1, 3)),
    grow=st.integers(1, 20),
    leaving=st.integers(1, BROKERS),
)
def test_new_partitions_and_leave_changes_are_the_bytes_the_upb_records_gave(
    max_changes: int,
    fenced: set[int],
    topics: list[tuple[int, int] | list[tuple[int, ...]]],
    big: tuple[int, int],
    grow: int,
    leaving: int,
) -> None:
    reference, shipped = runs = _both(max_changes)
    # small creates (before and after brokers are fenced: ISRs the replicas' tuple, or short of them)
    for when_fenced in (False, True):
        request = cpb.CreateTopicsRequest(cluster_id=CLUSTER)
        for number, shape in enumerate(topics):
            topic = request.topics.add(name=f"small-{int(when_fenced)}-{number}")
            if isinstance(shape, tuple):
                topic.num_partitions, topic.replication_factor = shape
            else:
                for partition, replicas in enumerate(shape):
                    topic.assignments.add(partition=partition, broker_ids=replicas)
        _same(reference, shipped, tuple(run.step("create_topics", request) for run in runs))
        if not when_fenced:
            for broker_id in sorted(fenced):
                for run in runs:
                    beat = cpb.BrokerHeartbeatRequest(
                        cluster_id=CLUSTER,
                        broker_id=broker_id,
                        broker_epoch=run.logic.image.brokers[broker_id].epoch,
                        want_fence=True,
                    )
                    run.step("broker_heartbeat", beat, 0)
    # a big topic, written in slices inside its transaction
    partitions, factor = big
    big_topic = cpb.CreatableTopic(
        name="big",
        num_partitions=max_changes + partitions,
        replication_factor=min(factor, BROKERS - len(fenced)),
    )
    _same(reference, shipped, tuple(run.big_topic(big_topic) for run in runs))
    # CreatePartitions
    grown = cpb.CreatePartitionsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatePartitionsTopic(name="big", count=max_changes + partitions + grow)],
    )
    _same(reference, shipped, tuple(run.step("create_partitions", grown) for run in runs))
    # a controlled shutdown: its leave changes in slices
    shutdown = cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=leaving)
    _same(reference, shipped, tuple(run.step("shutdown_broker", shutdown) for run in runs))


def _beat(run: _Run, broker_id: int, want_fence: bool) -> Step:
    beat = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        broker_epoch=run.logic.image.brokers[broker_id].epoch,
        current_metadata_offset=10**6,  # caught up: an unfence runs its elections
        want_fence=want_fence,
    )
    return run.step("broker_heartbeat", beat, 0)


@settings(max_examples=120, deadline=None)
@given(
    max_changes=st.integers(1, 6),  # 1: an unfence's elections all in the bulk slices (values)
    min_isr=st.integers(1, 3),
    unclean=st.booleans(),
    fenced=st.lists(st.integers(1, BROKERS), min_size=1, max_size=3, unique=True),
    topics=TOPICS,
    gone=st.integers(1, BROKERS),
)
def test_fences_unfences_and_unclean_leaves_are_the_bytes_the_upb_records_gave(
    max_changes: int,
    min_isr: int,
    unclean: bool,
    fenced: list[int],
    topics: list[tuple[int, int] | list[tuple[int, ...]]],
    gone: int,
) -> None:
    """Session 19: every leave shape (an ISR below min ISR, a sole replica's, the ELR's) and an unfence's
    elections (a broker back in an ELR, the preferred leader restored) go into the bulk slices as values
    — the same bytes as their upb records, in the same order, and the same images."""
    reference, shipped = runs = _both(max_changes, min_isr, unclean)
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER)
    for number, shape in enumerate(topics):
        topic = request.topics.add(name=f"t-{number}")
        if isinstance(shape, tuple):
            topic.num_partitions, topic.replication_factor = shape
        else:
            for partition, replicas in enumerate(shape):
                topic.assignments.add(partition=partition, broker_ids=replicas)
    _same(reference, shipped, tuple(run.step("create_topics", request) for run in runs))
    for broker_id in fenced:  # one after another: ISRs shrink below min ISR, then empty (the ELR)
        _same(reference, shipped, tuple(_beat(run, broker_id, True) for run in runs))
    for broker_id in reversed(fenced):  # back: elections from the ELR, preferred leaders restored
        _same(reference, shipped, tuple(_beat(run, broker_id, False) for run in runs))
    # an unregistered broker leaves every ISR and ELR as one whose data may be gone (last known ELR)
    unregister = cpb.UnregisterBrokerRequest(cluster_id=CLUSTER, broker_id=gone)
    _same(reference, shipped, tuple(run.step("unregister_broker", unregister) for run in runs))


def test_an_outcome_of_values_reads_as_its_records() -> None:
    records = [rec.wrap(pb.TopicRecord(name="t", topic_id="x")), rec.wrap(pb.NoOpRecord())]
    values = [rec.encode_value(r) for r in records]
    outcome = Outcome([], cpb.CreateTopicsResponse(), 5, values=values)
    assert outcome.records == records and outcome.encoded() is values and outcome.all_records() == records
    assert Outcome(records, cpb.CreateTopicsResponse(), 5).encoded() == values
