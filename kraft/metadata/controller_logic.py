"""The active controller's state machines: requests → metadata records (pure, no IO, injected time).

:class:`ControllerLogic` holds the *speculative* image — committed state plus every record this
controller has generated but not yet seen committed — so each request is validated against committed +
pending state.  Each mutating method validates, produces records, replays them into the speculative
image at the offsets they will get (``next_offset``, ``next_offset + 1``, …) and returns them with the
response; the shell appends exactly those records.  On leadership loss the shell calls :meth:`reset` with
the committed image and everything pending is dropped.

Broker lifecycle (Kafka's QuorumController, KIP-631):

=====================  =====================================  ========================================
state                  heartbeat                              next
=====================  =====================================  ========================================
FENCED                 want_shut_down (or operator shutdown)  SHUTDOWN_NOW (should_shut_down)
FENCED                 not want_fence and caught up           UNFENCED: unfence + elect (leaderless ones)
UNFENCED               want_fence                             FENCED: leave ISRs, move leaderships
UNFENCED               want_shut_down, leads partitions       CONTROLLED_SHUTDOWN: leave ISRs, move leaders
UNFENCED               want_shut_down, leads nothing          SHUTDOWN_NOW: fence
CONTROLLED_SHUTDOWN    any                                    SHUTDOWN_NOW once it leads nothing and every
                                                              active broker has seen the shutdown records
UNFENCED               no heartbeat for the session timeout   FENCED (periodic check, one at a time)
=====================  =====================================  ========================================

Caught up = the broker's reported metadata offset ≥ its broker epoch (the offset of its registration).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from google.protobuf.message import Message

from kraft.clock import CHECK_EVERY, DEFAULT_WORK_UNIT_MS, Clock, Deadline
from kraft.errors import ErrorCode, KraftError
from kraft.features import (
    LATEST_METADATA_VERSION,
    METADATA_VERSION_FEATURE,
    METADATA_VERSIONS,
    SUPPORTED_FEATURES,
    MetadataVersion,
)
from kraft.metadata import records as rec
from kraft.metadata.delta import MetadataDelta, shared_ids, shared_tuple
from kraft.metadata.election_config import (
    MIN_INSYNC_REPLICAS,
    PREFERRED_ELECTION,
    UNCLEAN_ELECTION,
    min_isr_for,
    unclean_election_for,
)
from kraft.metadata.elr_holders import elr_holders_of
from kraft.metadata.heartbeats import HeartbeatTracker, applied_offset
from kraft.metadata.image import (
    LEADER_RECOVERING,
    NO_PARTITION_LEADER,
    BrokerRegistration,
    BrokerRegistrationState,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from kraft.metadata.offline_replicas import guard_for
from kraft.metadata.partition_change import (
    LeaveMemo,
    build_change,
    build_change_encoded,
    leave_change_encoded,
    rules_matter,
)
from kraft.metadata.partition_counts import PartitionCounts
from kraft.metadata.partition_encode import new_partition_value, topic_field
from kraft.metadata.partition_reservations import (
    LeftOut,
    PartitionReservations,
    RequestOrder,
    Reservation,
    placement_bound,
)
from kraft.metadata.placement import (
    UsableBroker,
    UsableBrokerOrder,
    place_ordered_range,
    placed_replica_counts,
    rack_alternated,
    rack_count,
    validate_assignment,
)
from kraft.metadata.rejoin_index import GAP, RejoinIndex, RejoinWalk
from kraft.metadata.request_limits import (
    MAX_PARTITIONS_PER_TOPIC,
    RequestLimits,
    check_create_topics,
    check_delete_topics,
    check_elect_leaders,
    check_register_broker,
)
from kraft.metadata.topic_ids import TopicIds
from kraft.metadata.topic_rules import (
    check_partition_dir_names,
    check_partition_limits,
    colliding_name,
    validate_topic_configs,
    validate_topic_name,
)
from kraft.observability.logging import get_logger
from kraft.reaper import release_removed_topics
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

R = TypeVar("R", bound=Message)

# Defaults of max.partitions / max.broker.partitions (kraft/config.py has the keys): the image is measured
# up to 1,000,000 partitions; a broker keeps at least one open file per hosted partition, so 10,000 stays
# well inside a typical open-file limit once the broker has raised it to the hard limit.
DEFAULT_MAX_PARTITIONS = 1_000_000
DEFAULT_MAX_BROKER_PARTITIONS = 10_000
# Partitions a leave-job chunk looks at, at most: a chunk that finds few changes (the broker is in few
# ISRs) ends after this much scanning — possibly with no change — and the next chunk goes on.
LEAVE_SCAN_PARTITIONS = 10_000
# Partitions the rejoin index indexes per slice of its rebuild after activation (~1 µs each).
INDEX_SLICE_PARTITIONS = 5_000
# Dirty partitions the rejoin index settles per slice after bulk writes, at most (~1.5 µs each for a
# big topic, ~4 µs for a one-partition topic: the slice's time budget usually ends it first).
SETTLE_SLICE_PARTITIONS = 2_000
# The time budget of one such slice (ms; at most half the event budget).  Nothing waits for this settling
# (an unfence meanwhile settles the rest in its own job's slices), so it trickles: 1-ms slices with
# controller_writes.SETTLE_PAUSE_MS between them, ~10 % of the loop instead of ~55 % with half-budget
# slices 2 ms apart (session 12: after a 109k-leadership shutdown, 171 settle events took 508 ms of the
# leader's loop in the ~1 s after the job, while the heartbeats after the bulk phase had their p99).
SETTLE_SLICE_MS = 1
# What closing a leave-job chunk costs after its scan (adding the changes to the speculative image, its
# apply(), the rejoin and ELR indexes), in units of one changed partition: a touched topic costs this
# many more (bench.shutdown_profile, session 10: ~2 µs per change of a big topic, ~18 µs for a
# one-partition topic's change; the ratio matters, the unit's time is measured: _ClosingCost).
TOPIC_CLOSING_UNITS = 8
# The closing cost assumed before the first chunk measured it (ms per unit; ~2 µs on the 2-core host).
INITIAL_CLOSING_MS_PER_UNIT = 0.002


_election_log = get_logger("controller.elections")


def note_unclean_election(
    topic_name: str, partition_id: int, current: PartitionRegistration, change: pb.PartitionChangeRecord
) -> None:
    """The one warning an unclean election gets (records the lost replicas acknowledged may be gone).
    Logged when the active controller proposes it; the record commits or the controller is deposed."""
    if change.HasField("leader") and change.leader_recovery_state == LEADER_RECOVERING:
        _election_log.warning(
            "unclean_leader_elected",
            partition=f"{topic_name}-{partition_id}",
            old_leader=current.leader,
            old_isr=list(current.isr),
            old_elr=list(current.elr),
            new_leader=change.leader,
        )


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    cluster_id: str
    session_timeout_ms: int = 9000
    default_num_partitions: int = 1
    default_replication_factor: int = 1
    max_changes_per_write: int = 250
    """Partition changes per append when a broker leaves its ISRs or unfence elections run (a bulk job
    slice, ``controller.max.work.unit.records``); the rest follow in later appends."""
    max_event_time_ms: int = DEFAULT_WORK_UNIT_MS
    """``controller.max.event.time.ms``: the time budget of one event's bulk part (ISR removals, unfence
    elections, the topics of a CreateTopics part), read on the logic's clock; a slice stops at whichever
    of this and ``max_changes_per_write`` comes first (0 = records only)."""
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    """``max.partitions``: partitions in the cluster (each counted once, whatever its replication factor)."""
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS
    """``max.broker.partitions``: partition replicas assigned to one broker (each is an open log there)."""
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    """``max.request.topics`` / ``max.request.partitions``: checked before any work of a request."""
    bootstrap_features: Mapping[str, int] = field(
        default_factory=lambda: {METADATA_VERSION_FEATURE: LATEST_METADATA_VERSION}
    )
    """Levels a brand-new cluster starts at (the bootstrap checkpoint: ``kraft storage format
    --release-version``; kraft.metadata.bootstrap)."""
    supported_features: Mapping[str, tuple[int, int]] = field(
        default_factory=lambda: dict(SUPPORTED_FEATURES)
    )
    """What this controller's software supports (kraft.features); UpdateFeatures stays inside it."""
    metadata_versions: tuple[MetadataVersion, ...] = METADATA_VERSIONS
    """The metadata.version levels it knows, with what each changed (a safe downgrade must not cross one
    that changed the metadata)."""
    min_insync_replicas: int = 1
    """``min.insync.replicas`` for a topic with no value of its own nor a cluster-wide dynamic default:
    below it the ISR's departed members stay eligible leaders (KIP-966, kraft.metadata.election_config)."""
    unclean_leader_election_enable: bool = False
    """``unclean.leader.election.enable`` for a topic with no value of its own nor a cluster-wide default."""


class _ClosingCost:
    """The time a leave-job chunk spends after its scan (adding its changes, the speculative image and
    its indexes: ``_Batch.view``), per unit (a change, or :data:`TOPIC_CLOSING_UNITS` per touched topic),
    measured on the logic's clock after each chunk.  The scan counts what its changes will cost to close
    against the event's time budget (``Deadline.expired(reserve_ms)``), so a chunk of ~500 one-partition
    topics no longer closes 10 ms after a 5-ms scan (session 9: slices of 6-16 ms).  The first
    measurement replaces the initial guess; later ones move the estimate half-way, a sample counted at
    most at twice the estimate: a chunk preempted (or kept from the GIL) while closing raises it by half at
    most, while a lasting rise is followed within a few chunks."""

    __slots__ = ("measured", "ms_per_unit")

    def __init__(self) -> None:
        self.ms_per_unit = INITIAL_CLOSING_MS_PER_UNIT
        self.measured = False

    def note(self, elapsed_ms: int, units: int) -> None:
        if units <= 0:
            return
        sample = elapsed_ms / units
        if self.measured:
            # (capped from the initial guess at least: a closing under 1 ms reads 0 on a ms clock)
            cap = 2 * max(self.ms_per_unit, INITIAL_CLOSING_MS_PER_UNIT)
            self.ms_per_unit = (self.ms_per_unit + min(sample, cap)) / 2
        else:
            self.ms_per_unit, self.measured = sample, True


@dataclass(slots=True)
class _LeaveJob:
    """A broker leaving every ISR (fence, controlled shutdown, unregister), done in bounded chunks so a
    broker leading 100,000 partitions does not stall the event loop; ``tail`` records close the job."""

    broker_id: int
    topic_ids: list[str]
    position: int = 0  # index into topic_ids
    partition_position: int = 0  # next partition of topic_ids[position]
    tail: list[Message] = field(default_factory=list)
    memo: LeaveMemo = field(default_factory=dict)
    """leave_change's decisions, while ``memo_for`` — the speculative image's brokers and the brokers leaving,
    what its ``acceptable`` answers from — still holds (issue #17, session 15)."""
    memo_for: tuple[object, frozenset[int]] | None = None
    unclean: bool = False
    """The broker's data may be gone (a registration that cannot prove it kept its log dirs, an
    unregistration): it also leaves every ELR, so it is never elected from one (KIP-966).  A registration's
    reason is in the log too (``BrokerRegistration.unclean_shutdown``), so a job resumed by a new active
    controller is unclean as well; an unregistration's is not needed there: its record, the tail, is
    written only once the job is done, so after a failover the broker is still registered, with the proof
    (or not) of its incarnation chain, and the retried request starts the job again."""


class UncleanElectionScan:
    """Where an implicit UNCLEAN ElectLeaders (every leaderless partition, no list) is, taken in parts —
    one event each, of at most ``max.changes.per.write`` elections and the event's time budget (issue
    #17: its one-event ``RejoinIndex.unsettled`` was ~10-20 ms at 100,000 partitions).  Held by the
    request (the shell queues the next part from inside each event, as CreateTopics does), not by the
    logic: a controller that stops being active answers the parts left NOT_CONTROLLER, and the client's
    retry on the new one elects what is still leaderless — every election of an earlier part that
    committed left its partition led, so none is repeated and the end state equals one pass's."""

    __slots__ = ("done", "index", "parts", "position", "source", "started", "taken")

    def __init__(self) -> None:
        self.index: RejoinIndex | None = None  # the index ``source`` reads (a new logic: start over)
        # RejoinIndex.unsettled_ids; None before the first part and once a take came back short
        self.source: Iterator[tuple[str, int]] | None = None
        self.taken: list[tuple[str, int]] = []  # the candidates taken from ``source``, CHECK_EVERY at once
        self.position = 0  # the next of ``taken`` to look at
        self.started = False  # ``source`` made (once the index followed the image)
        self.done = False
        self.parts = 0


def _take_scan_candidates(source: Iterator[tuple[str, int]]) -> tuple[list[tuple[str, int]], bool]:
    """Up to ``CHECK_EVERY`` candidates of an :class:`UncleanElectionScan`, ending after a gap
    (``RejoinIndex.unsettled_ids(gaps=True)``: a window of topics or of a big topic's range read with
    nothing in it), so a take reads at most one empty window; True when ``source`` ran out."""
    taken: list[tuple[str, int]] = []
    for item in source:
        taken.append(item)
        if item[1] == GAP or len(taken) == CHECK_EVERY:
            return taken, False
    return taken, True


def merge_election_parts(answer: cpb.ElectLeadersResponse, more: cpb.ElectLeadersResponse) -> None:
    """Append a later part's results (:class:`UncleanElectionScan`) to ``answer``: a topic whose results
    two parts cut is one group again (the one-pass answer names each topic once)."""
    groups = iter(more.topics)
    first = next(groups, None)
    if first is None:
        return
    if answer.topics and answer.topics[-1].topic == first.topic:
        answer.topics[-1].partitions.extend(first.partitions)
    else:
        answer.topics.append(first)
    answer.topics.extend(groups)


@dataclass(slots=True)
class _RejoinJob:
    """Elections after a broker was unfenced, in bounded chunks: the partitions (topic id, partition id)
    that rejoining may change, from the rejoin index, each re-checked against the image of its own chunk.
    ``partitions`` is None while the index is not ready to answer (a bulk job's flags still to settle, a
    rebuild after activation): the job's first chunks get it ready, in slices, then take the candidates
    (see :meth:`ControllerLogic._rejoin_isrs`)."""

    broker_id: int
    partitions: list[tuple[str, int]] | None
    position: int = 0
    source: Iterator[tuple[TopicImage, int, PartitionRegistration]] | None = None
    """An unfence's candidates (``partitions`` stays empty), each taken when the job reaches it: the
    rejoin index's :class:`~kraft.metadata.rejoin_index.RejoinWalk` adds the partitions changed since the
    unfence, so nothing is taken ahead (session 21; a list of the first ``CHECK_EVERY`` before).  The
    job ends when a slice with room left finds none (a slice filled by its last candidate comes back
    once more: a partition changed meanwhile may follow it, as in the scan of every partition)."""


CREATE_TOPIC_TRANSACTION = "CreateTopic "
"""Prefix of the BeginTransactionRecord name of a sliced topic creation; JSON of its plan follows."""


class PlannedAhead:
    """Partitions of the plans made (:meth:`ControllerLogic.plan_topic`) and not yet checked for their
    write, refused or given up: later plans start their placement after them.  Each plan counts here
    once and uncounts itself once (:meth:`TopicPlan.release`); a reset starts a new one, so a plan of
    the term before uncounts nothing from it."""

    __slots__ = ("partitions",)

    def __init__(self) -> None:
        self.partitions = 0


@dataclass(slots=True)
class TopicPlan:
    """A topic too big for one work unit (auto-placed, more partitions than
    ``controller.max.work.unit.records``): placed slice by slice to count replicas per broker for the
    limits before any record is written (:meth:`place_some`), then written slice by slice inside a
    metadata transaction whose BeginTransactionRecord names this plan, so that a new active controller
    resumes it from the image (placement is a function of the plan: the same tuples either way)."""

    name: str
    partitions: int
    replication_factor: int
    start_index: int
    brokers: list[UsableBroker]
    """The usable brokers when it was planned (rack-alternated: the shared list of the logic's kept order,
    never changed; a resumed plan's as its transaction names them) — placement sorts them by id first,
    so any order of the same brokers places the same."""
    configs: dict[str, str]
    planned: int = 0
    by_broker: Counter[int] = field(default_factory=Counter)
    explicit: bool = False
    """An explicit replica assignment (the request's): checked slice by slice into :attr:`assignment`
    by :meth:`place_some`.  Its plan is not in the transaction's name (up to ~3 MB of replica lists for
    ``max.request.partitions``), so a new active controller cannot resume it: it removes what was
    written and closes the transaction (the client's retry creates the topic)."""
    source: Sequence[cpb.ReplicaAssignment] = ()
    check_replicas: Callable[[int, tuple[int, ...]], None] | None = None
    """Raises the KraftError an unsliced CreateTopics gives for partition ``p``'s replicas."""
    assignment: list[tuple[int, ...]] = field(default_factory=list)
    """Partition id → replicas of an explicit assignment (``()`` until its entry was checked)."""
    topic_id: str = ""
    """Assigned when planned for a prepared topic (its records are built before they are written)."""
    prepared: list[PartitionRegistration] | None = None
    """A prepared topic's registrations, by partition id (:meth:`ControllerLogic.prepare_some`)."""
    prepared_values: list[bytes] = field(default_factory=list)
    """… and their PartitionRecords, encoded as they were built (:func:`new_partition_value`): bytes,
    not a upb message per partition kept (GC-tracked, an arena each) until the write."""
    placed: list[tuple[int, ...]] = field(default_factory=list)
    """A prepared auto-placed topic's replica lists (to rebuild its records if brokers changed)."""
    prepared_for: tuple[object, frozenset[int]] | None = None
    """(brokers mapping, leaving brokers) the prepared records' ISRs were computed against."""
    ordered: tuple[list[UsableBroker], int] | None = None
    """:attr:`brokers` rack-alternated and their rack count, once: placing in slices of CHECK_EVERY
    partitions re-ordered 1,000 brokers per slice before (35-40 ms per 1,000 partitions, not ~1.7 ms)."""
    reservation: Reservation | None = None
    """Its partitions, reserved from the plan to its write (:meth:`ControllerLogic.plan_topic`): other
    requests are checked as if they existed; its replicas count per broker as :meth:`place_some` counts
    them.  Released when it is checked again for its write, when refused, or by :meth:`release`."""
    seq: int = 0
    """Its place among the reservations (a dry run's too): its write's check leaves out later plans'."""
    order: RequestOrder | None = None
    """Its request's topic positions (its write's check leaves out the request's plans listed after it)."""
    ahead: PlannedAhead | None = None
    """Where its partitions count as planned ahead, until :meth:`release`."""

    def release(self) -> None:
        """Drop the plan's reservation and its count ahead (checked for its write, refused or
        abandoned); idempotent."""
        if self.ahead is not None:
            self.ahead.partitions -= self.partitions
            self.ahead = None
        if self.reservation is not None:
            self.reservation.release()
            self.reservation = None

    def place(self, first: int, count: int) -> list[tuple[int, ...]]:
        if self.explicit:
            return self.assignment[first : first + count]
        if first + count <= len(self.placed):  # a prepared topic's, placed already
            return self.placed[first : first + count]
        if self.ordered is None:
            brokers = rack_alternated(self.brokers)
            self.ordered = brokers, rack_count(brokers)
        ordered, racks = self.ordered
        return place_ordered_range(ordered, racks, first, count, self.replication_factor, self.start_index)

    def replica_counts(
        self, first: int, count: int, max_placed: int, deadline: Deadline
    ) -> Counter[int] | None:
        """Replicas per broker of partitions ``first…first+count-1`` of an auto-placed plan, placing at
        most ``max_placed`` partitions to count them (:func:`placed_replica_counts`); None if that is
        not enough or ``deadline`` expires first."""
        if self.ordered is None:  # ordered once, for the placement that follows too
            brokers = rack_alternated(self.brokers)
            self.ordered = brokers, rack_count(brokers)
        ordered, racks = self.ordered
        return placed_replica_counts(
            ordered,
            racks,
            first,
            count,
            self.replication_factor,
            self.start_index,
            max_placed,
            deadline.expired,
        )

    def place_some(self, deadline: Deadline, max_partitions: int) -> bool:
        """Place (and count) up to ``max_partitions`` more partitions, or fewer when ``deadline``
        expires; True once every partition was counted.  An explicit assignment's entries are checked
        on the way (a refusal raises KraftError, as the unsliced CreateTopics refuses the topic)."""
        end = min(self.partitions, self.planned + max_partitions)
        while self.planned < end:
            step = min(CHECK_EVERY, end - self.planned)
            if self.explicit:
                try:
                    placed = self._check_explicit(self.planned, step)
                except KraftError:
                    self.release()  # refused: reserves nothing any more
                    raise
            else:
                placed = self.place(self.planned, step)
                if self.prepared is not None:
                    self.placed.extend(placed)
            replica_ids = [b for replicas in placed for b in replicas]
            self.by_broker.update(replica_ids)
            if self.reservation is not None:
                self.reservation.add_replica_ids(replica_ids)
            self.planned += step
            if deadline.expired():
                break
        return self.planned >= self.partitions

    def _check_explicit(self, first: int, count: int) -> list[tuple[int, ...]]:
        """Entries ``first…first+count-1`` of the request (in request order), checked like
        ``validate_assignment`` + ``check_some_replica_acceptable`` and put at their partition id."""
        if not self.assignment:
            self.assignment = [()] * self.partitions
        assignment = self.assignment
        factor = self.replication_factor
        check = self.check_replicas
        placed: list[tuple[int, ...]] = []
        for entry in self.source[first : first + count]:
            partition = entry.partition
            if not 0 <= partition < self.partitions or assignment[partition]:
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT, "assignment partitions must be 0..n-1, each once"
                )
            replicas = tuple(entry.broker_ids)
            if not replicas:
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {partition} has no replicas"
                )
            if len(replicas) != factor:
                raise KraftError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"partition {partition} has {len(replicas)} replicas, partition "
                    f"{self.source[0].partition} has {factor}",
                )
            if check is not None:
                check(partition, replicas)
            assignment[partition] = replicas
            placed.append(replicas)
        return placed

    def transaction_name(self, topic_id: str) -> str:
        plan: dict[str, object] = {
            "topic_id": topic_id,
            "name": self.name,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "start_index": self.start_index,
            "brokers": [[b.broker_id, b.rack] for b in self.brokers],
        }
        if self.explicit:
            plan["explicit"] = True
        return CREATE_TOPIC_TRANSACTION + json.dumps(plan, separators=(",", ":"))

    @staticmethod
    def parse(transaction: str) -> tuple[str, TopicPlan] | None:
        """(topic id, plan) from a transaction name, None when it is not a topic creation's."""
        if not transaction.startswith(CREATE_TOPIC_TRANSACTION):
            return None
        try:
            plan = json.loads(transaction[len(CREATE_TOPIC_TRANSACTION) :])
            brokers = [UsableBroker(int(b), None if r is None else str(r)) for b, r in plan["brokers"]]
            return str(plan["topic_id"]), TopicPlan(
                str(plan["name"]),
                int(plan["partitions"]),
                int(plan["replication_factor"]),
                int(plan["start_index"]),
                brokers,
                {},
                explicit=bool(plan.get("explicit", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def is_big_topic(topic: cpb.CreatableTopic, max_records: int, default_partitions: int) -> bool:
    """More partitions than one work unit (auto-placed or an explicit assignment): planned and written in
    slices."""
    if topic.assignments:
        return len(topic.assignments) > max_records
    partitions = default_partitions if topic.num_partitions == -1 else topic.num_partitions
    return partitions > max_records


PREPARED_TOPIC_MIN_PARTITIONS = 256
"""A topic of at least this many partitions (and at most a work unit) is *prepared*: placed (or its
explicit assignment checked) and its records built in events that write nothing, then appended in one
short event (issue #17).  Created in one event, a 1,000-partition topic took 10-12 ms on an idle 2-core
host and 23-36 ms at load 5, against the 5 ms budget; a topic below this is ~2.5 ms (idle)."""


def is_prepared_topic(
    topic: cpb.CreatableTopic, max_records: int, default_partitions: int, min_partitions: int
) -> bool:
    """``min_partitions`` or more, but not a big topic: prepared in bounded events, written in one."""
    if topic.assignments:
        partitions = len(topic.assignments)
    else:
        partitions = default_partitions if topic.num_partitions == -1 else topic.num_partitions
    return min_partitions <= partitions <= max_records


class TopicTransactionBusy(Exception):
    """Another big topic's transaction is still open: transactions never interleave (a reader keeps one
    open delta, and a resume knows one plan), so the caller waits for a commit and asks again."""


@dataclass(slots=True)
class _TopicJob:
    """The partitions of a planned topic still to write; ``plan`` None closes an open transaction this
    controller cannot resume: what it wrote of topic ``topic_id`` (an explicit assignment's) is removed
    first (an unknown transaction name has no topic: kraft writes only topic creations)."""

    topic_id: str
    plan: TopicPlan | None
    written: int
    reservation: Reservation | None = None
    """The partitions ``written…`` of the plan, reserved for the limit checks of other requests."""
    counting: Counter[int] | None = None
    """A resumed plan's replicas per broker of its unwritten partitions, counted from :attr:`counted` on
    before the writing resumes (meanwhile the reservation holds a conservative bound)."""
    counted: int = 0


@dataclass(slots=True)
class CreateTally:
    """What the earlier parts of one validate_only CreateTopics request would have created."""

    partitions: int = 0
    replicas: Counter[int] = field(default_factory=Counter)
    names: set[str] = field(default_factory=set)


class Outcome(Generic[R]):
    """Records to append (already replayed into the speculative image) and the response to send once
    they commit (at once when there are none).

    A write whose records were encoded as they were built (``values``: a created topic's or a grown
    topic's PartitionRecords, a bulk slice's changes) keeps only their bytes; ``records`` decodes them on
    first access (the readers are tests and benchmarks: the write path appends :meth:`encoded`)."""

    __slots__ = ("_records", "first_offset", "response", "values", "wait_offset")

    def __init__(
        self,
        records: list[pb.MetadataRecord],
        response: R,
        first_offset: int = -1,
        wait_offset: int | None = None,
        values: list[bytes] | None = None,
    ) -> None:
        self._records: list[pb.MetadataRecord] | None = records if values is None else None
        self.response = response
        self.first_offset = first_offset
        self.wait_offset: int | None = wait_offset
        """Without records: the offset the answer depends on (None = every pending write)."""
        self.values = values
        """Set (``records`` then decoded from it when read) by a write whose records are encoded
        already: the values to append, in order, :func:`~kraft.metadata.records.encode_value`'s bytes of
        each record."""

    @property
    def records(self) -> list[pb.MetadataRecord]:
        """The records to append (``values`` decoded, once, when the outcome carries values)."""
        if self._records is None:
            assert self.values is not None
            self._records = list(rec.decode_values(self.values))
        return self._records

    def encoded(self) -> list[bytes]:
        """The values to append (``records`` encoded, or ``values``)."""
        if self.values is not None:
            return self.values
        return [rec.encode_value(r) for r in self.records]

    def all_records(self) -> list[pb.MetadataRecord]:
        """:attr:`records` (kept for the readers written before ``records`` decoded values itself)."""
        return self.records

    def __repr__(self) -> str:
        size = len(self.values) if self.values is not None else len(self.records)
        return f"Outcome({size} records, first_offset={self.first_offset}, response={self.response!r})"


@dataclass(slots=True)
class _Batch:
    """Records being built for one request, replayed as they are added so later checks see them."""

    logic: ControllerLogic
    next_offset: int
    records: list[pb.MetadataRecord] = field(default_factory=list)
    delta: MetadataDelta | None = None
    values: list[bytes] | None = None
    """Set for a batch appended as values (:attr:`Outcome.values`: the writes of new partitions and the
    bulk slices): every record is encoded as it is added (``records`` stays empty), an encoded one
    (a prepared topic's, :func:`new_partition_value`'s, :func:`leave_change_encoded`'s) added as it is."""
    deadline: Deadline = field(init=False)
    """The event's time budget, started when the event began building its records."""

    def __post_init__(self) -> None:
        self.deadline = Deadline(self.logic.clock, self.logic.settings.max_event_time_ms)

    def _keep(self, record: pb.MetadataRecord) -> None:
        if self.values is None:
            self.records.append(record)
        else:
            self.values.append(rec.encode_value(record))

    def _next(self) -> int:
        """The offset the next record added gets."""
        return self.next_offset + (len(self.records) if self.values is None else len(self.values))

    def count(self) -> int:
        """The records added so far."""
        return len(self.records) if self.values is None else len(self.values)

    def add(self, payload: Message) -> None:
        record = rec.wrap(payload)
        if self.delta is None:
            self.delta = MetadataDelta(self.logic.image)
        offset = self._next()
        self.delta.replay(record, offset)
        self._keep(record)
        broker_id = _broker_of(payload)
        if broker_id is not None:
            self.logic.broker_offsets[broker_id] = offset

    def add_partition(
        self,
        record: pb.MetadataRecord | bytes,
        topic_id: str,
        partition_id: int,
        registration: PartitionRegistration,
    ) -> None:
        """Add a (wrapped) PartitionRecord/PartitionChangeRecord — or its value, encoded already —
        whose replay gives ``registration``, without replaying it (the bulk path: ~3x cheaper per
        partition)."""
        # (inline, not through _next/_keep: called once per partition of every create)
        if self.delta is None:
            self.delta = MetadataDelta(self.logic.image)
        values = self.values
        offset = self.next_offset + (len(self.records) if values is None else len(values))
        if not self.delta.set_partition(topic_id, partition_id, registration, offset):
            raise AssertionError(f"partition {topic_id}/{partition_id} does not fit the image")
        if values is None:
            self.records.append(rec.decode_value(record) if isinstance(record, bytes) else record)
        elif isinstance(record, bytes):
            values.append(record)
        else:
            values.append(rec.encode_value(record))

    def add_partition_value(
        self, value: bytes, topic_id: str, partition_id: int, registration: PartitionRegistration
    ) -> None:
        """:meth:`add_partition` of an encoded PartitionRecord (a batch of values only): its replay
        gives ``registration`` (:func:`new_partition_value` wrote it from that registration)."""
        values = self.values
        assert values is not None
        if self.delta is None:
            self.delta = MetadataDelta(self.logic.image)
        if not self.delta.set_partition(topic_id, partition_id, registration, self.next_offset + len(values)):
            raise AssertionError(f"partition {topic_id}/{partition_id} does not fit the image")
        values.append(value)

    def view(self) -> MetadataImage:
        """The image including what was added so far (cheap: only changed parts are rebuilt)."""
        if self.delta is not None:
            image = self.delta.apply()
            release_removed_topics(self.delta.removed_topics().values())  # (freed in slices: kraft.reaper)
            self.logic.rejoin_index.advance(self.delta, image.topics_by_id)
            self.logic.image = image
            self.delta = None
        return self.logic.image

    def finish(self) -> list[pb.MetadataRecord]:
        self.view()
        return self.records

    def finish_values(self) -> list[bytes]:
        """:meth:`finish` of a batch of values."""
        assert self.values is not None
        self.view()
        return self.values

    def outcome(self, response: R) -> Outcome[R]:
        """:meth:`finish`, and the outcome appending what was added (records or values)."""
        self.view()
        if self.values is None:
            return Outcome(self.records, response, self.next_offset)
        return Outcome([], response, self.next_offset, values=self.values)


def _leaderless(partition: PartitionRegistration) -> bool:
    return partition.leader == NO_PARTITION_LEADER


def _broker_of(payload: Message) -> int | None:
    """The broker a registration record is about (None for other records)."""
    if isinstance(
        payload, pb.BrokerRegistrationChangeRecord | pb.RegisterBrokerRecord | pb.UnregisterBrokerRecord
    ):
        return payload.broker_id
    if isinstance(payload, pb.FenceBrokerRecord | pb.UnfenceBrokerRecord):
        return payload.id
    return None


def error_response(response: R, code: ErrorCode, message: str) -> R:
    response.error_code = int(code)  # type: ignore[attr-defined]
    response.error_message = message  # type: ignore[attr-defined]
    return response


class ControllerLogic:
    def __init__(
        self,
        settings: ControllerSettings,
        image: MetadataImage,
        now_ms: int,
        new_topic_id: Callable[[], str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``clock`` times each event's bulk part against ``settings.max_event_time_ms`` (None: bounded
        by record counts only)."""
        self.settings = settings
        self.clock = clock
        self.image = image
        self.heartbeats = HeartbeatTracker(settings.session_timeout_ms)
        self._new_topic_id = new_topic_id or TopicIds()
        # offset of the last record of each broker's controlled shutdown (soft state, like Kafka's)
        self._shutdown_offsets: dict[int, int] = {}
        # per broker, the incarnations its latest accepted registration named as predecessors on its log
        # dirs (kraft.broker.incarnation): provably dead, so a RegisterBroker of theirs still on the wire
        # is refused (soft state: a new active controller forgets it and accepts such a request as any
        # other — an unclean re-registration, the safe side)
        self._superseded: dict[int, frozenset[str]] = {}
        # offset of the latest (maybe pending) record about each broker's registration: a heartbeat that
        # writes nothing waits only for that, not for unrelated bulk writes
        self.broker_offsets: dict[int, int] = {}
        # per-broker counts, recounted only for changed topics (full scans stall the loop for seconds)
        self._speculative_counts = PartitionCounts()
        self._committed_counts = PartitionCounts()
        # partitions an unfence may change, per broker, following the speculative image delta by delta
        self.rejoin_index = RejoinIndex()
        self._leaving: dict[int, _LeaveJob] = {}
        # (broker map, leaving brokers, the ids acceptable_in accepts): the map is never changed in place
        self._acceptable_ids: tuple[object, frozenset[int], frozenset[int]] | None = None
        # what closing a leave-job chunk costs per change (measured per chunk; a property of the host)
        self.closing_cost = _ClosingCost()
        # the same for an unfence-election chunk (its changes are replayed record by record: dearer)
        self.rejoin_closing_cost = _ClosingCost()
        self._rejoining: dict[int, _RejoinJob] = {}
        self._topic_jobs: dict[str, _TopicJob] = {}
        # partitions of topics planned but not written yet (the placement cursor of later plans)
        # the usable brokers rack-alternated for the speculative image's broker map, kept broker by broker
        self._placement = UsableBrokerOrder()
        self._planned_ahead = PlannedAhead()
        # ...and the same partitions for the limits of other requests (with their replicas per broker)
        self.reservations = PartitionReservations()
        self.reset(image, now_ms)

    # ---- lifecycle of the logic itself ----

    def reset(self, committed: MetadataImage, now_ms: int) -> None:
        """Drop pending state; give every registered broker a fresh session (a newly active controller)."""
        self.image = committed
        # not reached by a delta: rebuilt in slices (index_some, one per event of the shell's queue);
        # counts come from PartitionCounts till then, and an unfence meanwhile finishes it at once
        self.rejoin_index.start_rebuild(committed.topics_by_id)
        self._shutdown_offsets.clear()
        self._superseded.clear()
        self.broker_offsets.clear()
        self._leaving.clear()
        self._rejoining.clear()
        self._topic_jobs.clear()
        self._planned_ahead = PlannedAhead()  # plans of the term before uncount themselves from the old one
        self.reservations.clear()
        self._resume_bulk_jobs()
        self._resume_transaction()
        self.heartbeats.reset(((b.broker_id, b.fenced) for b in committed.brokers.values()), now_ms)

    def bootstrap_records(self, next_offset: int) -> list[pb.MetadataRecord]:
        """What a newly active controller writes on a brand-new cluster: the feature levels of the bootstrap
        checkpoint (metadata.version first, as Kafka's bootstrap metadata).  On any cluster without one, it
        also writes the cluster-wide ``min.insync.replicas`` from its own ``.properties`` (Kafka's
        ``maybeGenerateElrSafetyRecords``): from then on every broker and every controller resolve the
        minimum from the log (topic, else that value), never from their own ``.properties``, which may
        differ — a broker with a lower one would advance HWMs the ELR rules assume frozen."""
        batch = _Batch(self, next_offset)
        levels = self.settings.bootstrap_features
        if METADATA_VERSION_FEATURE not in self.image.features:  # a cluster bootstraps once, never again
            for name in sorted(levels, key=lambda n: (n != METADATA_VERSION_FEATURE, n)):
                batch.add(pb.FeatureLevelRecord(name=name, feature_level=levels[name]))
        if self.image.broker_config(-1, MIN_INSYNC_REPLICAS) is None:  # (no broker -1: the cluster default)
            batch.add(
                pb.ConfigRecord(
                    resource_type=rec.ConfigResourceType.BROKER,
                    resource_name="",
                    name=MIN_INSYNC_REPLICAS,
                    value=str(max(1, self.settings.min_insync_replicas)),
                )
            )
        return batch.finish()

    def noop_records(self, next_offset: int) -> list[pb.MetadataRecord]:
        batch = _Batch(self, next_offset)
        batch.add(pb.NoOpRecord())
        return batch.finish()

    def check_cluster_id(self, cluster_id: str) -> None:
        """Every request names this cluster; an empty id is refused like a wrong one (issue #15: an empty
        one used to skip the check).  Tools learn the id from DescribeCluster, which states it even when
        it refuses the request (see :class:`kraft.client.admin.AdminClient`)."""
        if cluster_id != self.settings.cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"request cluster id {cluster_id!r} does not match this cluster {self.settings.cluster_id!r}",
            )

    # ---- helpers over the speculative image ----

    def acceptable_in(self, image: MetadataImage) -> Callable[[int], bool]:
        """Brokers that may lead or join an ISR: registered, unfenced, not shutting down or leaving."""
        brokers = image.brokers
        leaving = self._leaving

        def acceptable(broker_id: int) -> bool:
            broker = brokers.get(broker_id)
            return (
                broker is not None
                and not broker.fenced
                and not broker.in_controlled_shutdown
                and broker_id not in leaving
            )

        return acceptable

    def acceptable_ids(self) -> frozenset[int]:
        """The broker ids :meth:`acceptable_in` accepts for the speculative image, as one set: a new
        partition's ISR is its whole replica list when the set holds it (one C call, not a Python call per
        replica).  Rebuilt (O(brokers)) when the image's broker map — never changed in place: a delta that
        changes a broker gives the next image a new map — or the leaving brokers change."""
        brokers = self.image.brokers
        cached = self._acceptable_ids
        leaving = frozenset(self._leaving)
        if cached is not None and cached[0] is brokers and cached[1] == leaving:
            return cached[2]
        ids = frozenset(
            broker_id
            for broker_id, broker in brokers.items()
            if not broker.fenced and not broker.in_controlled_shutdown and broker_id not in leaving
        )
        self._acceptable_ids = (brokers, leaving, ids)
        return ids

    def election_rules(self, image: MetadataImage, topic_name: str) -> tuple[int, bool]:
        """(min.insync.replicas, unclean.leader.election.enable) for the topic's elections."""
        settings = self.settings
        return (
            min_isr_for(image, topic_name, settings.min_insync_replicas),
            unclean_election_for(image, topic_name, settings.unclean_leader_election_enable),
        )

    def _resume_bulk_jobs(self) -> None:
        """A previous active controller may have stopped half-way through a bulk job; what is left is
        derivable from the image, found in one scan: fenced or shutting-down brokers still leading or in
        a shared ISR (a leave job each), and partitions whose election would change their leader, other
        than those (the elections an unfence had still to run: one rejoin job).

        A broker registered with ``unclean_shutdown`` (its data may be gone) still in any ISR or ELR gets
        an unclean leave job: the registration's job may have stopped half-way, and left in an ELR it
        could be elected with lost data once unfenced (the job blocks its unfence until done).  Found by a
        second scan, only while some broker has the flag."""
        brokers = self.image.brokers.values()
        gone = {b.broker_id for b in brokers if b.fenced or b.in_controlled_shutdown}
        data_lost = {b.broker_id for b in brokers if b.unclean_shutdown}
        acceptable = self.acceptable_in(self.image)
        guard = guard_for(self.image)
        pending: set[int] = set()
        pending_unclean: set[int] = set()
        electable: list[tuple[str, int]] = []
        for topic in self.image.topics_by_id.values():
            min_isr, unclean = self.election_rules(self.image, topic.name)
            for partition_id, partition in enumerate(topic.partitions):
                leader = partition.leader
                if leader in gone:
                    pending.add(leader)
                if len(partition.isr) > 1 and gone:
                    pending.update(gone.intersection(partition.isr))
                if leader in gone or (leader != NO_PARTITION_LEADER and leader == partition.replicas[0]):
                    continue  # a leave job moves it / the preferred leader leads: no election to run
                change = build_change(
                    topic.topic_id,
                    partition_id,
                    partition,
                    guard.for_partition(acceptable, topic.topic_id, partition_id)
                    if guard.active
                    else acceptable,
                    min_isr=min_isr,
                    unclean_election=unclean,
                )
                if change is not None:
                    electable.append((topic.topic_id, partition_id))
        if data_lost:  # rare (a wiped broker not yet unfenced): a scan of its own, the one above stays lean
            pending_unclean = self._still_eligible(data_lost)
        topic_ids = list(self.image.topics_by_id)
        for broker_id in sorted(pending | pending_unclean):
            self._leaving[broker_id] = _LeaveJob(
                broker_id, list(topic_ids), unclean=broker_id in pending_unclean
            )
        if electable:
            self._rejoining[NO_PARTITION_LEADER] = _RejoinJob(NO_PARTITION_LEADER, electable)

    def _still_eligible(self, brokers: set[int]) -> set[int]:
        """Those of ``brokers`` still in some ISR or ELR of the image (the leader is an ISR member)."""
        found: set[int] = set()
        for topic in self.image.topics_by_id.values():
            for partition in topic.partitions:
                if not brokers.isdisjoint(partition.isr):
                    found.update(brokers.intersection(partition.isr))
                if partition.elr and not brokers.isdisjoint(partition.elr):
                    found.update(brokers.intersection(partition.elr))
                if len(found) == len(brokers):
                    return found
        return found

    def _resume_transaction(self) -> None:
        """The committed log ends inside a metadata transaction: a previous active controller was writing
        a big topic when it stopped.  Its plan is in the transaction's name and what it wrote is in the
        image, so the rest follows as a bulk job (resume, not restart) and the transaction closes."""
        transaction = self.image.transaction
        if not transaction:
            return
        parsed = TopicPlan.parse(transaction)
        if parsed is None:
            self._topic_jobs[""] = _TopicJob("", None, 0)
            return
        topic_id, plan = parsed
        if plan.explicit:
            # The assignment is not in the log: undo (RemoveTopicRecord inside the transaction, so no
            # broker ever sees the topic) and close; the client's retry creates it whole.
            self._topic_jobs[topic_id] = _TopicJob(topic_id, None, 0)
            return
        topic = self.image.topics_by_id.get(topic_id)
        written = 0 if topic is None else len(topic.partitions)
        job = _TopicJob(topic_id, plan, written)
        if topic is not None and written < plan.partitions:
            # The rest is reserved again for the limits of other requests, with its replicas per broker
            # counted exactly when that takes at most a work unit of placements and of time (placement
            # repeats every brokers x (brokers - 1) partitions: a few brokers, any rest).  Otherwise (or
            # when the event's time budget ran out counting) they are counted
            # from the plan in slices before the writing resumes (_run_topic_jobs), and until then an
            # upper bound holds (O(brokers) here instead of placing the rest in one event).
            rest = plan.partitions - written
            budget = Deadline(self.clock, self.settings.max_event_time_ms)
            exact = plan.replica_counts(written, rest, self.settings.max_changes_per_write, budget)
            if exact is not None:
                job.reservation = self.reservations.reserve(rest, exact)
            else:
                bound = placement_bound(plan.brokers, rest, plan.replication_factor)
                job.reservation = self.reservations.reserve(rest, bound)
                job.counting = Counter()
                job.counted = written
        self._topic_jobs[topic_id] = job

    def creating(self, topic_id: str) -> bool:
        """Whether the topic is being written in slices (its partition count is not final yet)."""
        return topic_id in self._topic_jobs

    def index_some(self, limit: int = INDEX_SLICE_PARTITIONS) -> bool:
        """One slice of the rejoin index's rebuild after a reset, or of settling the flags bulk writes left
        dirty (``RejoinIndex.settle_some``); True once it follows the image with nothing dirty."""
        index = self.rejoin_index
        if not index.rebuild_some(self.image.topics_by_id, limit):
            return False
        # Short slices (SETTLE_SLICE_MS): nothing waits for the settling (an unfence before its end
        # settles the rest in its job's slices), and the heartbeats right after a bulk job compete with it.
        budget_ms = max(1, min(SETTLE_SLICE_MS, self.settings.max_event_time_ms // 2))
        deadline = Deadline(self.clock, budget_ms)
        return index.settle_some(min(limit, SETTLE_SLICE_PARTITIONS), deadline.expired)

    def has_bulk_jobs(self) -> bool:
        return bool(self._leaving or self._rejoining or self._topic_jobs)

    def continue_bulk_values(self, next_offset: int) -> list[bytes]:
        """The next chunk of ISR removals, unfence elections and big topics' partitions, encoded (the
        shell appends this until :meth:`has_bulk_jobs` is False); may be empty while jobs remain (a
        chunk that only scanned).  The common leave changes and the new partitions are encoded straight
        from their fields (:func:`leave_change_encoded`, :func:`new_partition_value`)."""
        batch = _Batch(self, next_offset, values=[])
        self._run_leave_jobs(batch)
        self._run_rejoin_jobs(batch)
        self._run_topic_jobs(batch)
        return batch.finish_values()

    def continue_bulk_jobs(self, next_offset: int) -> list[pb.MetadataRecord]:
        """:meth:`continue_bulk_values`, decoded (for tests and benchmarks that read the records)."""
        return list(rec.decode_values(self.continue_bulk_values(next_offset)))

    def elect_leaderless(self, batch: _Batch, topic_names: Iterable[str] | None) -> None:
        """Queue elections for the leaderless partitions of ``topic_names`` (every topic: None) — after
        ``unclean.leader.election.enable`` was turned on (Kafka elects offline partitions then too); the
        records follow in this write and the bulk job's next chunks, each decided on its chunk's image."""
        image = batch.view()
        topics = (
            list(image.topics_by_id.values())
            if topic_names is None
            else [t for t in map(image.topic, topic_names) if t is not None]
        )
        leaderless = [
            (topic.topic_id, partition_id)
            for topic in topics
            for partition_id, partition in enumerate(topic.partitions)
            if partition.leader == NO_PARTITION_LEADER
        ]
        if not leaderless:
            return
        job = self._rejoining.get(NO_PARTITION_LEADER)
        if job is None or job.partitions is None:  # (never None: only an unfence's job waits for the index)
            self._rejoining[NO_PARTITION_LEADER] = _RejoinJob(NO_PARTITION_LEADER, leaderless)
        else:
            job.partitions.extend(leaderless)
        self._run_rejoin_jobs(batch)

    def clear_elr(self, batch: _Batch, topic_names: Iterable[str] | None) -> int:
        """After ``min.insync.replicas`` changed for ``topic_names`` (None: the cluster-wide default, so
        every topic without a value of its own): clear each of their partitions' ELR and last known ELR
        in ``batch``, the write holding the ConfigRecord — one ``ClearElrRecord`` per topic named (one
        with no name for the default), as Kafka (KIP-966), written only when a partition holds either.
        An ELR member is safe only while the leader cannot advance the high watermark without it, which
        the old minimum guaranteed and the new one may not (a lower one lets a smaller ISR commit); kept,
        the stale members would be carried into every later ELR.  One atomic write, so no election ever
        sees the new minimum with the old ELR.  Every reader's replay visits only the partitions holding
        one (the image's ``elr_holders``), here too.  Returns the partitions changed."""
        image = batch.view()
        holders = elr_holders_of(image)
        if topic_names is None:
            cleared = sum(
                holders.topic_count(topic_id)
                for topic_id in holders.topic_ids()
                if MIN_INSYNC_REPLICAS not in image.topic_configs(image.topics_by_id[topic_id].name)
            )
            if cleared:
                batch.add(pb.ClearElrRecord())
            return cleared
        cleared = 0
        for name in topic_names:
            topic = image.topic(name)
            count = 0 if topic is None else holders.topic_count(topic.topic_id)
            if count:
                batch.add(pb.ClearElrRecord(topic_name=name))
                cleared += count
        return cleared

    def _run_topic_jobs(self, batch: _Batch) -> None:
        """The next partitions of the topics being written in slices; the last slice of each closes its
        transaction.  A topic deleted meanwhile (inside the transaction) just closes it."""
        budget = self.settings.max_changes_per_write - batch.count()
        deadline = batch.deadline
        for key, job in list(self._topic_jobs.items()):
            if budget <= 0 or deadline.expired():
                return
            plan = job.plan
            reservation = job.reservation
            if plan is not None and job.topic_id in batch.view().topics_by_id:
                if job.counting is not None:
                    budget = self._count_resumed(job, plan, budget, deadline)
                    if job.counting is not None or budget <= 0 or deadline.expired():
                        return
                end = min(plan.partitions, job.written + budget)
                while job.written < end:
                    step = min(CHECK_EVERY, end - job.written)
                    placed = plan.place(job.written, step)
                    self.add_partition_records(batch, job.topic_id, job.written, placed)
                    if reservation is not None:
                        reservation.consume(placed)
                    job.written += step
                    budget -= step
                    if deadline.expired():
                        break
                if job.written < plan.partitions:
                    return
            elif plan is None and job.topic_id in batch.view().topics_by_id:
                batch.add(pb.RemoveTopicRecord(topic_id=job.topic_id))
                budget -= 1
            if reservation is not None:
                reservation.release()  # written, or deleted meanwhile
            del self._topic_jobs[key]
            batch.add(pb.EndTransactionRecord())
            budget -= 1

    def _count_resumed(self, job: _TopicJob, plan: TopicPlan, budget: int, deadline: Deadline) -> int:
        """Count a resumed plan's unwritten replicas per broker, up to ``budget`` partitions or the
        ``deadline``; once all are counted the reservation holds the exact counts instead of its bound.
        The budget left."""
        counting = job.counting
        assert counting is not None
        end = min(plan.partitions, job.counted + budget)
        while job.counted < end:
            step = min(CHECK_EVERY, end - job.counted)
            counting.update(b for replicas in plan.place(job.counted, step) for b in replicas)
            job.counted += step
            budget -= step
            if deadline.expired():
                break
        if job.counted >= plan.partitions:
            if job.reservation is not None:
                job.reservation.set_replicas(counting)
            job.counting = None
        return budget

    def _partitions_of(self, broker_id: int) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        """Partitions listing ``broker_id`` as a replica in the image of the call (a full scan, taken as
        it is iterated: ~1 s per million partitions); the test oracle of :meth:`_rejoin_candidates`."""
        topics = self.image.topics_by_id  # (now, not at the first next(): a rejoin job takes it later)
        return (
            (topic, partition_id, partition)
            for topic in topics.values()
            for partition_id, partition in enumerate(topic.partitions)
            if broker_id in partition.replicas
        )

    def _rejoin_candidates(
        self, image: MetadataImage, broker_id: int, acceptable: Callable[[int], bool]
    ) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        """The partitions of ``broker_id`` (acceptable) that rejoining may change, in scan order, taken as
        the rejoin job reaches them: what :meth:`_partitions_of` + ``build_change`` changes on the image
        of each slice, from the index (cost in proportion to the broker's flagged partitions and those
        changed since; :class:`~kraft.metadata.rejoin_index.RejoinWalk`; test_rejoin_equivalence)."""
        return self.rejoin_index.walk(image.topics_by_id, broker_id, acceptable)

    def _placement_counts(self) -> tuple[int, Mapping[int, int]]:
        """Partitions in the speculative image and replicas per broker (not changed until the caller's
        batch is viewed).  From the rejoin index when it follows the image (kept delta by delta);
        otherwise recounted per changed topic (the replicas per broker are not kept by the image; a walk
        over every topic cost 5 % of CPU under many small CreateTopics, and a fence changes nearly every
        topic)."""
        index = self.rejoin_index
        if index.current_for is self.image.topics_by_id:
            return index.partitions, index.replica_counts
        self._speculative_counts.update(self.image.topics_by_id)
        return self._speculative_counts.partitions, self._speculative_counts.replicas

    def leader_count(self, broker_id: int) -> int:
        """Partitions the broker leads in the speculative image.

        Counted incrementally (only topics changed since the last call are recounted): a broker in
        controlled shutdown heartbeats every couple of seconds while its leaderships move in chunks.
        """
        index = self.rejoin_index
        if index.current_for is self.image.topics_by_id:
            return index.leader_counts[broker_id]  # exact too, and kept delta by delta: no recount
        self._speculative_counts.update(self.image.topics_by_id)
        return self._speculative_counts.leaders[broker_id]

    def count_some(self, committed: MetadataImage | None, limit: int) -> bool:
        """Recount up to ~``limit`` partitions of the committed (``committed``) or, when None, the
        speculative image's changed topics; True once the counts are current.  The shell calls this
        with the event loop free in between, so :meth:`describe_brokers` / :meth:`leader_count` find
        little left to count after bulk writes."""
        current = self.rejoin_index.current_for
        if committed is not None:
            if current is committed.topics_by_id:
                return True  # describe_brokers reads the index's counts, kept delta by delta
            return self._committed_counts.update(committed.topics_by_id, limit)
        if current is self.image.topics_by_id:
            return True  # leader_count / the placement counts read the index: nothing to recount
        return self._speculative_counts.update(self.image.topics_by_id, limit)

    def _leave_isrs(
        self, batch: _Batch, broker_id: int, tail: tuple[Message, ...] = (), *, unclean: bool = False
    ) -> None:
        """Start removing the broker from every ISR (and, ``unclean``, every ELR) and moving its
        leaderships; as much as fits in this write happens now, the rest through
        :meth:`continue_bulk_jobs`."""
        job = self._leaving.get(broker_id)
        if job is None:
            job = self._leaving[broker_id] = _LeaveJob(broker_id, list(self.image.topics_by_id))
        else:  # already leaving: rescan from the start, the state may have changed meanwhile
            job.topic_ids, job.position, job.partition_position = list(self.image.topics_by_id), 0, 0
        job.tail.extend(tail)
        job.unclean = job.unclean or unclean
        self._run_leave_jobs(batch)

    def _run_leave_jobs(self, batch: _Batch) -> None:
        budget = self.settings.max_changes_per_write - batch.count()
        scan_budget = LEAVE_SCAN_PARTITIONS  # bounds a chunk that finds few changes (a long scan)
        deadline = batch.deadline
        clock = self.clock if self.settings.max_event_time_ms > 0 else None
        closing = self.closing_cost
        ticks = 0
        for job in list(self._leaving.values()):
            if budget <= 0 or scan_budget <= 0:
                return
            image = batch.view()  # fresh per job: two jobs may touch the same partition
            acceptable = self.acceptable_in(image)
            guard = guard_for(image)
            # acceptable answers from the image's brokers and the brokers leaving: the job's memo of
            # decisions holds while both do (a per-partition guard answers per partition: no memo)
            leaving = frozenset(self._leaving)
            if job.memo_for is None or job.memo_for[0] is not image.brokers or job.memo_for[1] != leaving:
                job.memo, job.memo_for = {}, (image.brokers, leaving)
            memo = None if guard.active else job.memo
            topics = image.topics_by_id
            broker_id = job.broker_id
            unclean_shutdown = job.unclean
            # a batch of values takes the common changes encoded straight from their fields
            encoded = batch.values is not None
            changes: list[tuple[pb.MetadataRecord | bytes, str, int, PartitionRegistration]] = []
            touched = 0  # topics with a change in ``changes`` (each costs its own share of the closing)
            while job.position < len(job.topic_ids) and len(changes) < budget and scan_budget > 0:
                topic = topics.get(job.topic_ids[job.position])
                partitions = () if topic is None else topic.partitions
                # Looked up at the topic's first partition whose change may depend on them: a sole
                # replica's leave never does (two config lookups saved per one-partition topic).
                rules: tuple[int, bool] | None = None
                topic_bytes: bytes | None = None  # topic_field, at the topic's first change
                index = job.partition_position
                end = min(len(partitions), index + scan_budget)
                scan_budget -= end - index + 1
                had = len(changes)
                while index < end and len(changes) < budget:
                    partition = partitions[index]
                    if (
                        broker_id in partition.isr
                        or partition.leader == broker_id
                        or (unclean_shutdown and broker_id in partition.elr)
                    ):
                        assert topic is not None
                        accept = (
                            guard.for_partition(acceptable, topic.topic_id, index)
                            if guard.active
                            else acceptable
                        )
                        if rules is None and rules_matter(partition, accept, broker_id):
                            rules = self.election_rules(image, topic.name)
                        min_isr, unclean_election = (1, False) if rules is None else rules
                        if encoded and topic_bytes is None:
                            topic_bytes = topic_field(topic.topic_id)
                        change = leave_change_encoded(
                            topic.topic_id,
                            # (an unclean election's change is logged from its record)
                            None if unclean_election else topic_bytes,
                            index,
                            partition,
                            accept,
                            broker_id,
                            min_isr=min_isr,
                            unclean_shutdown=unclean_shutdown,
                            unclean_election=unclean_election,
                            memo=memo,
                        )
                        if change is not None:
                            if unclean_election:
                                assert not isinstance(change[0], bytes)
                                note_unclean_election(
                                    topic.name, index, partition, change[0].partition_change
                                )
                            changes.append((change[0], topic.topic_id, index, change[1]))
                    index += 1
                    ticks += 1
                    if ticks >= CHECK_EVERY:
                        ticks = 0
                        # the event's time budget, what closing the changes so far will take counted
                        # as spent: the rest in the next slice
                        pending = len(changes) + TOPIC_CLOSING_UNITS * (touched + (len(changes) > had))
                        if deadline.expired(closing.ms_per_unit * pending):
                            scan_budget = 0
                            break
                if len(changes) > had:
                    touched += 1
                if index < len(partitions):
                    job.partition_position = index  # budget used up inside this topic
                else:
                    job.position, job.partition_position = job.position + 1, 0
            if changes:
                started_ms = clock.monotonic_ms() if clock is not None else 0
                add_partition = batch.add_partition
                for wrapped, topic_id, partition_id, registration in changes:
                    add_partition(wrapped, topic_id, partition_id, registration)
                batch.view()  # closed here (not by whatever comes next), so its time is measured
                if clock is not None:
                    closing.note(
                        clock.monotonic_ms() - started_ms, len(changes) + TOPIC_CLOSING_UNITS * touched
                    )
            budget -= len(changes)
            if job.position >= len(job.topic_ids):
                del self._leaving[broker_id]
                for record in job.tail:
                    batch.add(record)

    def _rejoin_isrs(self, batch: _Batch, broker_id: int) -> None:
        """After unfencing: run elections on the broker's partitions (an offline partition whose ISR kept
        it gets it as leader).  It does not go back into ISRs here: the partition leader proposes that by
        AlterPartition once the replica caught up (kraft/metadata/isr_changes.py) — a replica missing
        committed records must never be electable.  Candidates come from the rejoin index (a superset of
        the partitions an election can change), in the full scan's order; as many elections as fit this
        write run now, the rest through :meth:`continue_bulk_jobs`.

        The index answers only once it follows the image with no dirty flags.  Right after a bulk job
        (a 109k-leadership shutdown leaves ~0.2-0.3 s of flags to settle) that does not fit this event:
        it settles what fits the event's budget, and when flags remain the job starts without its
        candidates — its chunks settle the rest in slices (:meth:`_candidates_ready`) and then take
        them, on the image of that chunk (issue #17: no event longer than the budget)."""
        batch.view()
        if not self._candidates_ready(batch.deadline):
            self._rejoining[broker_id] = _RejoinJob(broker_id, None)
            return
        if self.rejoin_index.replica_counts[broker_id] <= 0:
            return  # hosts nothing (the index follows the image here: its counts are exact)
        # A job even when nothing is flagged (what a fence leaves is not): partitions changed before its
        # slices come are elected in it, and this event runs the jobs queued before it, as the scan's did.
        job = _RejoinJob(broker_id, [], source=self._unfence_candidates(batch.view(), broker_id))
        self._rejoining[broker_id] = job
        self._run_rejoin_jobs(batch)

    def _candidates_ready(self, deadline: Deadline) -> bool:
        """One bounded step of getting the rejoin index ready for the speculative image (its sliced
        rebuild, then the dirty flags, until ``deadline``); True once a candidates query is only the
        broker's flagged partitions."""
        index = self.rejoin_index
        topics = self.image.topics_by_id
        if index.ready_for(topics):
            return True
        if not index.catch_up(topics, INDEX_SLICE_PARTITIONS, deadline.expired):
            return False
        return index.ready_for(topics)

    def _unfence_candidates(
        self, image: MetadataImage, broker_id: int
    ) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        """The candidates of the broker's rejoin job (the query runs now, on ``image``), to take one at a
        time as the job goes."""
        return self._rejoin_candidates(image, broker_id, self.acceptable_in(image))

    def _run_rejoin_jobs(self, batch: _Batch) -> None:
        budget = self.settings.max_changes_per_write - batch.count()
        scan_budget = LEAVE_SCAN_PARTITIONS
        deadline = batch.deadline
        clock = self.clock if self.settings.max_event_time_ms > 0 else None
        closing = self.rejoin_closing_cost
        ticks = 0
        for job in list(self._rejoining.values()):
            if budget <= 0 or scan_budget <= 0:
                return
            image = batch.view()
            if job.partitions is None:  # its unfence found the index not ready: settle, then take them
                if not self._candidates_ready(deadline):
                    return  # this slice's budget is spent: the rest in the next one
                job.partitions, job.source = [], self._unfence_candidates(image, job.broker_id)
            acceptable = self.acceptable_in(image)
            source = job.source
            if isinstance(source, RejoinWalk):
                source.at_slice(image.topics_by_id, acceptable)  # (may fall back to the scan of the rest)
            ended = False
            guard = guard_for(image)
            topics = image.topics_by_id
            # A batch of values (session 19) takes each election encoded from its decision, with the
            # registration it gives (no upb record, no replay: registration None marks a record); an
            # unclean election's is logged from its record, as a leave job's.
            encoded = batch.values is not None
            changes: list[
                tuple[pb.PartitionChangeRecord | bytes, str, int, PartitionRegistration | None]
            ] = []
            topic_bytes: dict[str, bytes] = {}  # topic_field per topic, for this chunk
            partitions = job.partitions
            rules: dict[str, tuple[int, bool]] = {}  # per topic, for this chunk's image
            touched: set[str] = set()  # topics with a change (each costs its own share of the closing)
            while len(changes) < budget and scan_budget > 0:
                if source is not None:
                    taken = next(source, None)
                    if taken is None:
                        ended = True
                        break
                    topic_id, partition_id = taken[0].topic_id, taken[1]
                else:
                    if job.position >= len(partitions):
                        break
                    topic_id, partition_id = partitions[job.position]
                    job.position += 1
                scan_budget -= 1
                topic = topics.get(topic_id)
                if topic is None or partition_id >= len(topic.partitions):
                    continue  # deleted meanwhile
                topic_rules = rules.get(topic_id)
                if topic_rules is None:
                    topic_rules = rules[topic_id] = self.election_rules(image, topic.name)
                min_isr, unclean = topic_rules
                current = topic.partitions[partition_id]
                accept = (
                    guard.for_partition(acceptable, topic_id, partition_id) if guard.active else acceptable
                )
                if encoded and not unclean:
                    topic_field_bytes = topic_bytes.get(topic_id)
                    if topic_field_bytes is None:
                        topic_field_bytes = topic_bytes[topic_id] = topic_field(topic_id)
                    encoded_change = build_change_encoded(
                        topic_field_bytes, partition_id, current, accept, min_isr=min_isr
                    )
                    if encoded_change is not None:
                        changes.append((encoded_change[0], topic_id, partition_id, encoded_change[1]))
                        touched.add(topic_id)
                else:
                    change = build_change(
                        topic_id, partition_id, current, accept, min_isr=min_isr, unclean_election=unclean
                    )
                    if change is not None:
                        if unclean:
                            note_unclean_election(topic.name, partition_id, current, change)
                        changes.append((change, topic_id, partition_id, None))
                        touched.add(topic_id)
                ticks += 1
                if ticks >= CHECK_EVERY:
                    ticks = 0
                    # the event's time budget, what closing the changes so far will take counted as
                    # spent (as a leave job's chunk): the rest in the next slice
                    pending = len(changes) + TOPIC_CLOSING_UNITS * len(touched)
                    if deadline.expired(closing.ms_per_unit * pending):
                        scan_budget = 0
            if changes:
                started_ms = clock.monotonic_ms() if clock is not None else 0
                add_partition = batch.add_partition
                for elected, topic_id, partition_id, registration in changes:  # (in scan order)
                    if isinstance(elected, bytes):
                        assert registration is not None
                        add_partition(elected, topic_id, partition_id, registration)
                    else:
                        batch.add(elected)
                batch.view()  # closed here (not by whatever comes next), so its time is measured
                if clock is not None:
                    closing.note(
                        clock.monotonic_ms() - started_ms,
                        len(changes) + TOPIC_CLOSING_UNITS * len(touched),
                    )
            budget -= len(changes)
            if ended or (source is None and job.position >= len(partitions)):
                del self._rejoining[job.broker_id]

    def _record_offline_replicas(
        self, batch: _Batch, broker: BrokerRegistration, offline: Iterable[cpb.OfflinePartition]
    ) -> None:
        """Write the broker's replicas of ``offline`` (on a log dir it took offline) that its registration
        does not list yet into it: from then on no election picks them
        (:mod:`kraft.metadata.offline_replicas`), on this controller and on any later one (the log has
        them).  Nothing when all are listed (later heartbeats repeat the same report)."""
        image = batch.view()
        listed = broker.offline_replicas
        new: set[tuple[str, int]] = set()
        for ref in offline:
            topic_id = image.topic_ids_by_name.get(ref.topic)
            if topic_id is None or (topic_id, ref.partition) in listed:
                continue
            current = image.partition(topic_id, ref.partition)
            if current is not None and broker.broker_id in current.replicas:
                new.add((topic_id, ref.partition))
        if new:
            batch.add(
                pb.BrokerRegistrationChangeRecord(
                    broker_id=broker.broker_id,
                    broker_epoch=broker.epoch,
                    offline_replicas=rec.offline_replicas_records(new),
                )
            )

    def _leave_offline_replicas(
        self, batch: _Batch, broker_id: int, offline: Iterable[cpb.OfflinePartition]
    ) -> None:
        """The broker's replicas of ``offline`` (on a log dir it took offline, Kafka's
        ``handleDirectoriesOffline``; :meth:`_record_offline_replicas` wrote them into its registration
        first): out of their ISRs, leadership to another acceptable ISR member, or none (an offline
        partition) when it was the last.  Idempotent: later heartbeats repeating the list change nothing."""
        image = batch.view()
        acceptable = self.acceptable_in(image)
        guard = guard_for(image)
        for ref in offline:
            topic_id = image.topic_ids_by_name.get(ref.topic)
            current = None if topic_id is None else image.partition(topic_id, ref.partition)
            if topic_id is None or current is None or broker_id not in current.replicas:
                continue
            if broker_id not in current.isr and current.leader != broker_id:
                continue
            # The replica joins the ELR like any departing member (the dir's data is unreachable, not known
            # lost: a restart on the repaired dir proves its incarnation as any restart does); the
            # registration's offline_replicas keeps it from being elected — here (the guard) and later.
            min_isr, unclean = self.election_rules(image, ref.topic)
            change = build_change(
                topic_id,
                ref.partition,
                current,
                guard.for_partition(acceptable, topic_id, ref.partition),
                remove_from_isr=broker_id,
                min_isr=min_isr,
                unclean_election=unclean,
            )
            if change is not None:
                if unclean:
                    note_unclean_election(ref.topic, ref.partition, current, change)
                batch.add(change)

    def _fence(self, batch: _Batch, broker: BrokerRegistration) -> None:
        # The registration change comes first so no election picks the broker while it leaves its ISRs.
        batch.add(
            pb.BrokerRegistrationChangeRecord(broker_id=broker.broker_id, broker_epoch=broker.epoch, fenced=1)
        )
        self.heartbeats.set_fenced(broker.broker_id, True)
        self._rejoining.pop(broker.broker_id, None)
        self._leave_isrs(batch, broker.broker_id)

    def _unfence(self, batch: _Batch, broker: BrokerRegistration) -> None:
        batch.add(
            pb.BrokerRegistrationChangeRecord(
                broker_id=broker.broker_id, broker_epoch=broker.epoch, fenced=-1
            )
        )
        self._rejoin_isrs(batch, broker.broker_id)
        self.heartbeats.set_fenced(broker.broker_id, False)

    def _enter_controlled_shutdown(self, batch: _Batch, broker: BrokerRegistration) -> None:
        batch.add(
            pb.BrokerRegistrationChangeRecord(
                broker_id=broker.broker_id, broker_epoch=broker.epoch, in_controlled_shutdown=1
            )
        )
        self._shutdown_offsets[broker.broker_id] = batch.next_offset + batch.count() - 1
        if not broker.fenced:
            self._leave_isrs(batch, broker.broker_id)

    def _others_have_seen_shutdown(self, broker_id: int) -> bool:
        offset = self._shutdown_offsets.get(broker_id, -1)
        for other in self.heartbeats.unfenced_ids():
            if other == broker_id:
                continue
            contact = self.heartbeats.contact(other)
            if contact is not None and contact.metadata_offset < offset:
                return False
        return True

    # ---- broker lifecycle ----

    def register_broker(
        self, req: cpb.RegisterBrokerRequest, now_ms: int, next_offset: int
    ) -> Outcome[cpb.RegisterBrokerResponse]:
        response = cpb.RegisterBrokerResponse()
        try:
            self.check_cluster_id(req.cluster_id)
            self._validate_registration(req)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        existing = self.image.brokers.get(req.broker_id)
        replaces = False
        if existing is not None:
            if existing.incarnation_id == req.incarnation_id:
                # A retried registration of the same process keeps its epoch and state.
                self.heartbeats.touch(req.broker_id, now_ms, -1)
                response.broker_epoch = existing.epoch
                return Outcome([], response)
            if req.incarnation_id in self._superseded.get(req.broker_id, ()):
                # A request of a process its successor on the same log dirs already named (found by the
                # replication sim, seed 48: a crashed process's RegisterBroker, delayed on the network,
                # arrived after its successor registered).  Accepting it would judge the broker unclean
                # — it names only older predecessors — and take it out of every ELR for nothing.
                return Outcome(
                    [],
                    error_response(
                        response,
                        ErrorCode.INVALID_REGISTRATION,
                        f"broker {req.broker_id} incarnation {req.incarnation_id} was superseded by "
                        f"{existing.incarnation_id} on the same log dirs",
                    ),
                )
            # A live session blocks a new incarnation unless the request names the registered one among
            # its predecessors on the same log dirs (the previous one, or an earlier one whose successors
            # all died before their registration was answered): that process is gone, and this one has
            # its log dirs (kraft.broker.incarnation).
            replaces = bool(existing.incarnation_id) and existing.incarnation_id in (
                req.previous_incarnation_id,
                *req.earlier_incarnation_ids,
            )
            if (
                not existing.fenced
                and not replaces
                and self.heartbeats.has_valid_session(req.broker_id, now_ms)
            ):
                return Outcome(
                    [],
                    error_response(
                        response,
                        ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                        f"broker {req.broker_id} is registered with incarnation {existing.incarnation_id} "
                        f"whose session is still alive",
                    ),
                )
        batch = _Batch(self, next_offset)
        # KIP-966's unclean shutdown, kraft's way: a new incarnation that does not name the registered one
        # among its predecessors cannot prove it runs on the same log dirs (wiped, replaced, another host),
        # so what it had replicated may be gone: out of every ELR (docs/internals/replication.md).  In the
        # record, not only in this controller's job: a failover in the middle of the sliced removal must
        # not leave it in the ELRs still to do.  A successor on the same dirs inherits a flag not yet
        # cleared (by the unfence): it has the very same dirs.
        unclean = existing is not None and (not replaces or existing.unclean_shutdown)
        record = pb.RegisterBrokerRecord(
            broker_id=req.broker_id,
            incarnation_id=req.incarnation_id,
            broker_epoch=next_offset,
            endpoints=list(req.listeners),
            features=list(req.features),
            fenced=True,
            log_dirs=list(req.log_dirs),
            unclean_shutdown=unclean,
        )
        if req.HasField("rack"):
            record.rack = req.rack
        if existing is not None and not existing.fenced:
            # The old incarnation's session expired (or it is gone: see above) but it was not fenced yet:
            # fence it first.
            self._fence(batch, existing)
        record.broker_epoch = batch.next_offset + batch.count()
        batch.add(record)
        if unclean:
            self._leave_isrs(batch, req.broker_id, unclean=True)
        self._shutdown_offsets.pop(req.broker_id, None)
        self._superseded[req.broker_id] = frozenset(
            i for i in (req.previous_incarnation_id, *req.earlier_incarnation_ids) if i
        )
        self.heartbeats.register(req.broker_id, now_ms)
        response.broker_epoch = record.broker_epoch
        return Outcome(batch.finish(), response, next_offset)

    def _validate_registration(self, req: cpb.RegisterBrokerRequest) -> None:
        if req.broker_id < 0:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"broker id must be ≥ 0, got {req.broker_id}")
        if not req.incarnation_id:
            raise KraftError(ErrorCode.INVALID_REGISTRATION, "incarnation id is empty")
        check_register_broker(req)
        if any(not d for d in req.log_dirs):
            raise KraftError(ErrorCode.INVALID_REGISTRATION, "a log dir is empty")
        for endpoint in req.listeners:
            if not endpoint.host or not 0 < endpoint.port < 65536:
                raise KraftError(
                    ErrorCode.INVALID_REGISTRATION, f"bad listener {endpoint.host}:{endpoint.port}"
                )
        level = self.image.features.get(METADATA_VERSION_FEATURE)
        for feature in req.features:
            supported = feature.min_supported_version <= (level or 0) <= feature.max_supported_version
            if feature.name == METADATA_VERSION_FEATURE and level is not None and not supported:
                raise KraftError(
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"broker supports {METADATA_VERSION_FEATURE} {feature.min_supported_version}-"
                    f"{feature.max_supported_version}, the cluster is at {level}",
                )

    def broker_heartbeat(
        self, req: cpb.BrokerHeartbeatRequest, now_ms: int, next_offset: int
    ) -> Outcome[cpb.BrokerHeartbeatResponse]:
        response = cpb.BrokerHeartbeatResponse()
        try:
            self.check_cluster_id(req.cluster_id)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        broker = self.image.brokers.get(req.broker_id)
        if broker is None or broker.epoch != req.broker_epoch:
            known = "not registered" if broker is None else f"registered with epoch {broker.epoch}"
            return Outcome(
                [],
                error_response(
                    response,
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker {req.broker_id} epoch {req.broker_epoch} is stale: {known}",
                ),
            )
        self.heartbeats.touch(req.broker_id, now_ms, req.current_metadata_offset)
        caught_up = req.current_metadata_offset >= broker.epoch
        response.is_caught_up = caught_up
        batch = _Batch(self, next_offset)
        if req.offline_partitions:
            # Recorded even while fenced (the broker may still be in ELRs, and an unfence in this very
            # heartbeat runs elections): before anything below elects.
            self._record_offline_replicas(batch, broker, req.offline_partitions)
            if not broker.fenced:
                self._leave_offline_replicas(batch, broker.broker_id, req.offline_partitions)
        if broker.fenced:
            response.is_fenced = True
            if req.want_shut_down or broker.in_controlled_shutdown:
                response.should_shut_down = True
            elif not req.want_fence and caught_up and broker.broker_id not in self._leaving:
                self._unfence(batch, broker)
                response.is_fenced = False
        elif req.want_fence:
            self._fence(batch, broker)
            response.is_fenced = True
        elif req.want_shut_down or broker.in_controlled_shutdown:
            if not broker.in_controlled_shutdown and self.leader_count(broker.broker_id) > 0:
                self._enter_controlled_shutdown(batch, broker)
            elif (
                broker.broker_id not in self._leaving
                and self.leader_count(broker.broker_id) == 0
                and self._others_have_seen_shutdown(broker.broker_id)
            ):
                self._fence(batch, broker)
                response.is_fenced = True
                response.should_shut_down = True
        records = batch.finish()
        depends_on = max(
            self.broker_offsets.get(broker.broker_id, -1), self._shutdown_offsets.get(broker.broker_id, -1)
        )
        return Outcome(records, response, next_offset, wait_offset=depends_on)

    def steady_heartbeats(self) -> dict[int, tuple[int, int]]:
        """Per broker whose heartbeat, as long as it asks for nothing (no want_fence, want_shut_down or
        offline partitions), :meth:`broker_heartbeat` answers with no record and only ``is_caught_up``:
        ``broker id -> (epoch, the offset that answer waits for)`` — registered, unfenced, not in
        controlled shutdown, not leaving.  What :mod:`kraft.metadata.heartbeat_lane` publishes to the
        request plane; keep it in step with :meth:`broker_heartbeat`."""
        leaving = self._leaving
        offsets = self.broker_offsets
        shutdowns = self._shutdown_offsets
        return {
            broker_id: (broker.epoch, max(offsets.get(broker_id, -1), shutdowns.get(broker_id, -1)))
            for broker_id, broker in self.image.brokers.items()
            if not broker.fenced and not broker.in_controlled_shutdown and broker_id not in leaving
        }

    def _registered_broker(self, cluster_id: str, broker_id: int) -> BrokerRegistration:
        """The registration an unregister / controlled-shutdown request is about (KraftError: a wrong
        cluster id, or no such broker)."""
        self.check_cluster_id(cluster_id)
        broker = self.image.brokers.get(broker_id)
        if broker is None:
            raise KraftError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} is not registered")
        return broker

    def unregister_broker(
        self, req: cpb.UnregisterBrokerRequest, next_offset: int
    ) -> Outcome[cpb.UnregisterBrokerResponse]:
        response = cpb.UnregisterBrokerResponse()
        try:
            broker = self._registered_broker(req.cluster_id, req.broker_id)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        batch = _Batch(self, next_offset)
        unregister = pb.UnregisterBrokerRecord(broker_id=broker.broker_id, broker_epoch=broker.epoch)
        # Unregistered, it can never prove its data survived (a later registration has no predecessor to
        # name): out of every ELR too.
        self._leave_isrs(batch, broker.broker_id, tail=(unregister,), unclean=True)
        self.heartbeats.remove(broker.broker_id)
        self._shutdown_offsets.pop(broker.broker_id, None)
        return Outcome(batch.finish(), response, next_offset)

    def shutdown_broker(
        self, req: cpb.ShutdownBrokerRequest, next_offset: int
    ) -> Outcome[cpb.ShutdownBrokerResponse]:
        response = cpb.ShutdownBrokerResponse()
        try:
            broker = self._registered_broker(req.cluster_id, req.broker_id)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        batch = _Batch(self, next_offset, values=[])  # its first leave changes encoded as they are built
        if not broker.in_controlled_shutdown:
            self._enter_controlled_shutdown(batch, broker)
        batch.view()
        response.leaderships_remaining = self.leader_count(broker.broker_id)
        return batch.outcome(response)

    def fence_expired(self, now_ms: int, next_offset: int) -> tuple[int, list[pb.MetadataRecord]]:
        """Fence at most one broker whose session expired; returns (broker id or -1, records)."""
        broker_id = self.heartbeats.next_expired(now_ms)
        if broker_id is None:
            return -1, []
        broker = self.image.brokers.get(broker_id)
        if broker is None or broker.fenced:
            self.heartbeats.set_fenced(broker_id, True)
            return -1, []
        batch = _Batch(self, next_offset)
        self._fence(batch, broker)
        return broker_id, batch.finish()

    # ---- topics ----

    def create_topics(
        self,
        req: cpb.CreateTopicsRequest,
        next_offset: int,
        tally: CreateTally | None = None,
        order: RequestOrder | None = None,
    ) -> Outcome[cpb.CreateTopicsResponse]:
        """``tally`` carries a validate_only request's earlier parts (the shell splits big requests into
        parts; a dry run writes nothing, so later parts would not see earlier ones in the image).
        ``order``: the client's request when its big or prepared topics were planned apart (a topic
        does not count the partitions they reserve when it is listed before them).

        Stops after the topic during which the event's time budget ran out: the response then lists only
        the first topics of ``req`` (at least one), in order, and the caller asks again for the rest."""
        response = cpb.CreateTopicsResponse()
        try:
            self.check_cluster_id(req.cluster_id)
            check_create_topics(req, self.settings.request_limits, self.settings.default_num_partitions)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        batch = _Batch(self, next_offset, values=[])  # PartitionRecords encoded as they are built
        counts: dict[str, int] = {}
        for topic in req.topics:
            counts[topic.name] = counts.get(topic.name, 0) + 1
        dry_run = tally if req.validate_only else None
        # Replicas per broker before this request plus what its earlier topics added (validate_only too:
        # a dry run is bounded exactly like the real one), and the placement cursor.
        partitions, hosted = self._placement_counts()
        cursor = partitions + (dry_run.partitions if dry_run else 0)
        # Placement starts after the plans made before this request and a big topic's unwritten rest, as
        # it would after their unsliced creations (the limits count those through the reservations, so
        # they are checked against ``cursor``).
        place_at = cursor + self._planned_ahead.partitions + self.written_ahead
        created: set[str] = dry_run.names if dry_run else set()
        added: Counter[int] = dry_run.replicas if dry_run else Counter()
        for topic in req.topics:
            if response.topics and batch.deadline.expired():
                # The event's time budget is spent: the response lists the topics handled so far and the
                # shell sends the rest as the next part (a topic is never split here).
                break
            result = response.topics.add(name=topic.name)
            try:
                if counts[topic.name] > 1:
                    raise KraftError(
                        ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} appears more than once"
                    )
                self._check_new_name(topic.name, created)
                left_out = None
                if order is not None:
                    position = order.positions.get(topic.name, 0)
                    left_out = self.reservations.left_out(None, order, position)
                # Checked before placement too, so a huge request costs nothing before it is refused.
                self._check_partition_counts(
                    topic, self._requested_partitions(topic), cursor, {}, hosted, added, left_out
                )
                assignment = self._assignment_for(topic, place_at)
                by_broker = Counter(b for replicas in assignment for b in replicas)
                self._check_partition_counts(
                    topic, len(assignment), cursor, by_broker, hosted, added, left_out
                )
                self.check_some_replica_acceptable(assignment)
                configs = validate_topic_configs(
                    [(c.name, c.value) for c in topic.configs], len(assignment[0])
                )
            except KraftError as exc:
                error_response(result, exc.code, exc.message)
                continue
            topic_id = self._new_topic_id()
            result.topic_id = topic_id
            result.num_partitions = len(assignment)
            result.replication_factor = len(assignment[0])
            created.add(topic.name)
            cursor += len(assignment)
            place_at += len(assignment)
            added.update(by_broker)
            if dry_run is not None:
                dry_run.partitions += len(assignment)
            if req.validate_only:
                continue
            self._add_topic_records(batch, topic.name, topic_id, assignment, configs)
        return batch.outcome(response)

    @property
    def planned_ahead(self) -> int:
        """Partitions of the plans made and not yet checked for their write, refused or given up."""
        return self._planned_ahead.partitions

    @property
    def written_ahead(self) -> int:
        """Partitions of the big topics being written in slices that are not in the image yet: a plan
        made during such a write starts its placement after them, as it would after the unsliced
        creation (the image holds only the slices written so far, and the plan stopped counting ahead
        at its write's check).  O(topics being written): at most one, transactions do not interleave;
        a topic deleted mid-way counts nothing more, and a resumed one its rest."""
        ahead = 0
        topics = self.image.topics_by_id
        for job in self._topic_jobs.values():
            plan = job.plan
            if plan is not None and job.topic_id in topics:
                ahead += plan.partitions - job.written
        return ahead

    def check_planned_ahead(self, pending: Iterable[TopicPlan]) -> None:
        """Invariant (for tests): the count planned ahead is exactly ``pending``'s partitions — the
        plans of this term the caller holds that were not checked for their write, refused or given up.
        Raises AssertionError otherwise."""
        plans = list(pending)
        expected = sum(plan.partitions for plan in plans)
        foreign = [plan.name for plan in plans if plan.ahead is not self._planned_ahead]
        if foreign or self._planned_ahead.partitions != expected:
            raise AssertionError(
                f"planned_ahead={self._planned_ahead.partitions} expected={expected} "
                f"pending={len(plans)} not_counted={foreign}"
            )

    def is_big_topic(self, topic: cpb.CreatableTopic) -> bool:
        settings = self.settings
        return is_big_topic(topic, settings.max_changes_per_write, settings.default_num_partitions)

    def plan_topic(
        self,
        req: cpb.CreateTopicsRequest,
        next_offset: int,
        prepared: bool = False,
        order: RequestOrder | None = None,
    ) -> tuple[Outcome[cpb.CreateTopicsResponse], TopicPlan | None]:
        """The first step of a big or a ``prepared`` topic (``req`` holds just it; ``order``: the
        positions in the client's request): every check that needs no placement, and its plan — or its
        error in the response.  Writes nothing; reserves its partitions until its write.  Plans made
        before earlier ones were written start their placement after them (as consecutive topics of
        one request would), so concurrent topics do not all rotate leaders from the same broker."""
        outcome, plan = self._plan_topic(req, next_offset)
        if plan is not None:
            plan.start_index += self._planned_ahead.partitions + self.written_ahead
            self._planned_ahead.partitions += plan.partitions
            plan.ahead = self._planned_ahead
            plan.order = order
            if req.validate_only:  # a dry run holds nothing
                plan.seq = self.reservations.take_seq()
            else:
                plan.reservation = self.reservations.reserve(
                    plan.partitions,
                    planned=True,
                    order=order,
                    position=order.positions.get(plan.name, 0) if order is not None else 0,
                )
                plan.seq = plan.reservation.seq
            if prepared:
                plan.topic_id = self._new_topic_id()
                plan.prepared = [] if not req.validate_only else None
        return outcome, plan

    def _plan_topic(
        self, req: cpb.CreateTopicsRequest, next_offset: int
    ) -> tuple[Outcome[cpb.CreateTopicsResponse], TopicPlan | None]:
        response = cpb.CreateTopicsResponse()
        try:
            self.check_cluster_id(req.cluster_id)
            check_create_topics(req, self.settings.request_limits, self.settings.default_num_partitions)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message)), None
        (topic,) = req.topics
        result = response.topics.add(name=topic.name)
        partitions, hosted = self._placement_counts()
        try:
            self._check_new_name(topic.name, set())
            requested = self._requested_partitions(topic)
            self._check_partition_counts(topic, requested, partitions, {}, hosted, {})
            if topic.assignments:
                return self._plan_explicit(topic, requested, partitions, response, next_offset)
            if requested > MAX_PARTITIONS_PER_TOPIC:
                self._assignment_for(topic, partitions)  # raises INVALID_PARTITIONS (before placing)
            factor = topic.replication_factor
            if factor == -1:
                factor = self.settings.default_replication_factor
            if factor <= 0:
                self._assignment_for(topic, partitions)  # raises INVALID_REPLICATION_FACTOR
            # The usable brokers already rack-alternated, from the order kept per broker map: a plan of
            # its own (a UsableBroker per broker, then rack_alternated at its first placement) cost ~1.3 ms
            # at 1,000 brokers, ~0.13 s over a request of 100 prepared topics.  rack_alternated sorts by
            # id first, so the plan (and a transaction naming it) places exactly as from the image's order.
            usable, racks = self._placement_order()
            if factor > len(usable):
                raise KraftError(
                    ErrorCode.INVALID_REPLICATION_FACTOR, self.too_few_brokers(factor, len(usable))
                )
            configs = validate_topic_configs([(c.name, c.value) for c in topic.configs], factor)
        except KraftError as exc:
            error_response(result, exc.code, exc.message)
            return Outcome([], response, next_offset), None
        plan = TopicPlan(topic.name, requested, factor, partitions, usable, configs)
        plan.ordered = usable, racks
        return Outcome([], response, next_offset), plan

    def _plan_explicit(
        self,
        topic: cpb.CreatableTopic,
        requested: int,
        cursor: int,
        response: cpb.CreateTopicsResponse,
        next_offset: int,
    ) -> tuple[Outcome[cpb.CreateTopicsResponse], TopicPlan | None]:
        """plan_topic for an explicit assignment: the checks that need no pass over it; its entries are
        checked by :meth:`TopicPlan.place_some`, a slice per event.  Raises KraftError."""
        if topic.num_partitions not in (-1, 0) or topic.replication_factor not in (-1, 0):
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                "give either an explicit assignment or partitions/replication factor, not both",
            )
        factor = len(topic.assignments[0].broker_ids)
        if factor == 0:
            raise KraftError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {topic.assignments[0].partition} has no replicas",
            )
        configs = validate_topic_configs([(c.name, c.value) for c in topic.configs], factor)
        registered = self.image.brokers
        acceptable = self.acceptable_in(self.image)

        def check(partition: int, replicas: tuple[int, ...]) -> None:
            if len(set(replicas)) != len(replicas):
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {partition} repeats a broker"
                )
            unknown = [b for b in replicas if b not in registered]
            if unknown:
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {partition} names unregistered brokers {unknown}",
                )
            if not any(acceptable(r) for r in replicas):
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"every broker assigned to partition {partition} ({list(replicas)}) is fenced, "
                    f"shutting down or leaving",
                )

        plan = TopicPlan(
            topic.name,
            requested,
            factor,
            cursor,
            [],
            configs,
            explicit=True,
            source=topic.assignments,
            check_replicas=check,
        )
        return Outcome([], response, next_offset), plan

    def _recheck_plan(self, plan: TopicPlan, result: cpb.CreatableTopicResult) -> bool:
        """A planned topic's name and partition limits checked again against the image as it is now
        (with the per-broker counts of the complete plan); its partitions stop counting as planned
        ahead either way.  False: refused, the error set on ``result``."""
        # checked like any other request's, but plans made after it wait for it (request order, as the
        # unsliced request); a big topic's write reserves anew
        plan.release()
        order = plan.order
        position = order.positions.get(plan.name, 0) if order is not None else 0
        later = self.reservations.left_out(plan.seq, order, position)
        partitions, hosted = self._placement_counts()
        try:
            self._check_new_name(plan.name, set())
            topic = cpb.CreatableTopic(name=plan.name)
            self._check_partition_counts(
                topic, plan.partitions, partitions, plan.by_broker, hosted, {}, later
            )
        except KraftError as exc:
            error_response(result, exc.code, exc.message)
            return False
        return True

    def create_planned_topic(
        self, plan: TopicPlan, validate_only: bool, next_offset: int
    ) -> Outcome[cpb.CreateTopicsResponse]:
        """The checks again with the per-broker counts of the complete plan, against the image as it is
        now; then (unless ``validate_only``) BeginTransaction, the topic, its configs and the first
        partitions — the rest as a bulk job (:meth:`continue_bulk_jobs`), EndTransaction last.  Raises
        :class:`TopicTransactionBusy` while another big topic is being written."""
        if self._topic_jobs and not validate_only:
            raise TopicTransactionBusy
        response = cpb.CreateTopicsResponse()
        result = response.topics.add(name=plan.name)
        if not self._recheck_plan(plan, result):
            return Outcome([], response, next_offset)
        batch = _Batch(self, next_offset, values=[])  # its first partitions encoded as they are built
        topic_id = self._new_topic_id()
        result.topic_id = topic_id
        result.num_partitions = plan.partitions
        result.replication_factor = plan.replication_factor
        if validate_only:
            return Outcome([], response, next_offset)
        batch.add(pb.BeginTransactionRecord(name=plan.transaction_name(topic_id)))
        batch.add(pb.TopicRecord(name=plan.name, topic_id=topic_id))
        for key, value in sorted(plan.configs.items()):
            batch.add(
                pb.ConfigRecord(
                    resource_type=rec.ConfigResourceType.TOPIC, resource_name=plan.name, name=key, value=value
                )
            )
        reservation = self.reservations.reserve(plan.partitions, plan.by_broker)
        self._topic_jobs[topic_id] = _TopicJob(topic_id, plan, 0, reservation)
        self._run_topic_jobs(batch)
        return batch.outcome(response)

    def prepare_some(self, plan: TopicPlan, deadline: Deadline, max_partitions: int) -> bool:
        """One event of a prepared topic: place (or check, for an explicit assignment) up to
        ``max_partitions`` more partitions, fewer when ``deadline`` expires, and build their records;
        True once all are.  Writes nothing; an explicit entry's refusal raises KraftError."""
        unbounded = Deadline(None, 0)
        prepared = plan.prepared
        work = 0
        while work < max_partitions:
            # placing and building interleaved, so the deadline covers both (~2 + ~4 µs per partition)
            if plan.planned < plan.partitions:
                first = plan.planned
                step = min(CHECK_EVERY, plan.partitions - first, max_partitions - work)
                plan.place_some(unbounded, step)
                if prepared is not None and not plan.explicit:
                    self._prepare_records(plan, first, plan.place(first, step))
            elif prepared is not None and len(prepared) < plan.partitions:
                # an explicit assignment's records once every entry was checked (entries come in any
                # order, each naming its partition)
                first = len(prepared)
                step = min(CHECK_EVERY, plan.partitions - first, max_partitions - work)
                self._prepare_records(plan, first, plan.place(first, step))
            else:
                break
            work += step
            if deadline.expired():
                break
        return plan.planned >= plan.partitions and (prepared is None or len(prepared) >= plan.partitions)

    def _prepare_records(self, plan: TopicPlan, first: int, placed: list[tuple[int, ...]]) -> None:
        assert plan.prepared is not None
        snapshot = (self.image.brokers, frozenset(self._leaving))
        if plan.prepared_for is not None and (
            plan.prepared_for[0] is not snapshot[0] or plan.prepared_for[1] != snapshot[1]
        ):
            # brokers changed since the earlier records were built: their ISRs are rebuilt at the write
            plan.prepared_for = None
        elif plan.prepared_for is None and not plan.prepared:
            plan.prepared_for = snapshot
        # an auto-placed plan's tuples hold the registrations' own ints: shared as they are (shared_tuple)
        registrations = list(self._new_registrations(placed, placed_ids=not plan.explicit))
        # Encoded now, from the registrations (the ISR is the replicas' very tuple in the common case):
        # the bytes encode_value gives the record _new_partitions builds, without that upb message.
        topic = topic_field(plan.topic_id)
        plan.prepared_values.extend(
            [
                new_partition_value(topic, partition_id, g.replicas, g.isr, g.leader)
                for partition_id, g in enumerate(registrations, first)
            ]
        )
        plan.prepared.extend(registrations)

    def create_prepared_topic(
        self, plan: TopicPlan, validate_only: bool, next_offset: int
    ) -> Outcome[cpb.CreateTopicsResponse]:
        """The write of a prepared topic (placed and built by :meth:`prepare_some`): the checks again
        against the image as it is now, then its records in one append — the records one CreateTopics
        event gives for it (partitions placed from the plan's cursor)."""
        response = cpb.CreateTopicsResponse()
        result = response.topics.add(name=plan.name)
        if not self._recheck_plan(plan, result):
            return Outcome([], response, next_offset)
        result.topic_id = plan.topic_id
        result.num_partitions = plan.partitions
        result.replication_factor = plan.replication_factor
        if validate_only or plan.prepared is None:
            return Outcome([], response, next_offset)
        batch = _Batch(self, next_offset, values=[])  # appended as values: the prepared ones as they are
        batch.add(pb.TopicRecord(name=plan.name, topic_id=plan.topic_id))
        snapshot = (self.image.brokers, frozenset(self._leaving))
        prepared_for = plan.prepared_for
        if prepared_for is not None and prepared_for[0] is snapshot[0] and prepared_for[1] == snapshot[1]:
            add_value = batch.add_partition_value
            topic_id = plan.topic_id
            values, registrations = plan.prepared_values, plan.prepared
            for partition_id, (encoded, registration) in enumerate(zip(values, registrations, strict=True)):
                add_value(encoded, topic_id, partition_id, registration)
        else:  # a broker changed meanwhile: ISRs and leaders from the brokers as they are now
            assignment = plan.assignment if plan.explicit else plan.placed
            self.add_partition_records(batch, plan.topic_id, 0, assignment)
        for key, value in sorted(plan.configs.items()):
            batch.add(
                pb.ConfigRecord(
                    resource_type=rec.ConfigResourceType.TOPIC, resource_name=plan.name, name=key, value=value
                )
            )
        return Outcome([], response, next_offset, values=batch.finish_values())

    def _check_new_name(self, name: str, created: set[str]) -> None:
        validate_topic_name(name)
        if name in self.image.topic_ids_by_name or name in created:
            raise KraftError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        clash = colliding_name(name, self.image.topic_ids_by_name) or colliding_name(name, created)
        if clash is not None:
            raise KraftError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic {name!r} collides with topic {clash!r} ('.' and '_' are equivalent)",
            )

    def _requested_partitions(self, topic: cpb.CreatableTopic) -> int:
        if topic.assignments:
            return len(topic.assignments)
        return self.settings.default_num_partitions if topic.num_partitions == -1 else topic.num_partitions

    def _check_partition_counts(
        self,
        topic: cpb.CreatableTopic,
        partitions: int,
        cursor: int,
        by_broker: Mapping[int, int],
        hosted: Mapping[int, int],
        added: Mapping[int, int],
        left_out: LeftOut | None = None,
    ) -> None:
        """The limits, counting the partitions reserved by topics still being created (less
        ``left_out``: what plans made after the one checked hold)."""
        if partitions <= 0 or partitions > MAX_PARTITIONS_PER_TOPIC:
            return  # _assignment_for refuses it with INVALID_PARTITIONS
        check_partition_dir_names(topic.name, partitions)
        reserved = self.reservations
        broker_reserved: Callable[[int], int] | None = None
        broker_left_out: Callable[[int], int] | None = None
        if left_out:
            broker_reserved = reserved.replicas_lookup()
            broker_left_out = left_out.replicas_on  # summed only for a broker the full count refuses
        elif len(reserved):  # nothing pending: no lookups per broker
            broker_reserved = reserved.replicas_lookup()
        check_partition_limits(
            topic.name,
            partitions,
            cursor,
            self.settings.max_partitions,
            by_broker,
            lambda b: hosted.get(b, 0) + added.get(b, 0),
            self.settings.max_broker_partitions,
            reserved.partitions - (left_out.partitions if left_out is not None else 0),
            broker_reserved,
            broker_left_out,
        )

    def _assignment_for(self, topic: cpb.CreatableTopic, cursor: int) -> list[tuple[int, ...]]:
        if topic.assignments:
            if topic.num_partitions not in (-1, 0) or topic.replication_factor not in (-1, 0):
                raise KraftError(
                    ErrorCode.INVALID_REQUEST,
                    "give either an explicit assignment or partitions/replication factor, not both",
                )
            by_partition = sorted(topic.assignments, key=lambda a: a.partition)
            if [a.partition for a in by_partition] != list(range(len(by_partition))):
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT, "assignment partitions must be 0..n-1, each once"
                )
            return validate_assignment([list(a.broker_ids) for a in by_partition], set(self.image.brokers))
        partitions = topic.num_partitions
        if partitions == -1:
            partitions = self.settings.default_num_partitions
        if partitions <= 0 or partitions > MAX_PARTITIONS_PER_TOPIC:
            raise KraftError(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be 1..{MAX_PARTITIONS_PER_TOPIC} (or -1 for the default), "
                f"got {topic.num_partitions}",
            )
        factor = topic.replication_factor
        if factor == -1:
            factor = self.settings.default_replication_factor
        if factor <= 0:
            raise KraftError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor must be positive (or -1: default), got {topic.replication_factor}",
            )
        ordered, racks = self._placement_order()
        if factor > len(ordered):
            raise KraftError(ErrorCode.INVALID_REPLICATION_FACTOR, self.too_few_brokers(factor, len(ordered)))
        # what place_replicas(<the usable brokers>, ...) places, from the cached order
        return place_ordered_range(ordered, racks, 0, partitions, factor, cursor)

    def _placement_order(self) -> tuple[list[UsableBroker], int]:
        """The usable brokers :func:`rack_alternated` and their rack count, for the speculative image's
        brokers.  Ordering them is O(brokers log brokers) — ~1 ms at 1,000 brokers — and every
        CreateTopics placed its partitions from a fresh order; the brokers change rarely.  An image's
        broker map is never changed in place (a delta that changes a broker gives the next image a new
        map), so that map object is the key (held, so its id cannot be reused); a new map moves only the
        brokers it changed (:class:`UsableBrokerOrder`)."""
        return self._placement.of(self.image.brokers)

    def too_few_brokers(self, factor: int, usable: int) -> str:
        """Why ``factor`` replicas cannot be placed: which registered brokers are not usable right now."""
        brokers = self.image.brokers.values()
        fenced = sorted(b.broker_id for b in brokers if b.fenced)
        stopping = sorted(b.broker_id for b in brokers if b.in_controlled_shutdown and not b.fenced)
        text = (
            f"replication factor {factor} is larger than the {usable} available (unfenced) brokers; "
            f"{len(self.image.brokers)} registered"
        )
        if fenced:
            text += f", fenced: {fenced}"
        if stopping:
            text += f", in controlled shutdown: {stopping}"
        if fenced:
            text += " — a broker that just started or restarted is fenced until it catches up; retry shortly"
        return text

    def check_some_replica_acceptable(self, assignment: list[tuple[int, ...]]) -> None:
        acceptable = self.acceptable_in(self.image)
        for partition_id, replicas in enumerate(assignment):
            if not any(acceptable(r) for r in replicas):
                raise KraftError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"every broker assigned to partition {partition_id} ({list(replicas)}) is fenced, "
                    f"shutting down or leaving",
                )

    def _add_topic_records(
        self,
        batch: _Batch,
        name: str,
        topic_id: str,
        assignment: list[tuple[int, ...]],
        configs: dict[str, str],
    ) -> None:
        batch.add(pb.TopicRecord(name=name, topic_id=topic_id))
        self.add_partition_records(batch, topic_id, 0, assignment)
        for key, value in sorted(configs.items()):
            batch.add(
                pb.ConfigRecord(
                    resource_type=rec.ConfigResourceType.TOPIC, resource_name=name, name=key, value=value
                )
            )

    def add_partition_records(
        self, batch: _Batch, topic_id: str, first_id: int, assignment: list[tuple[int, ...]]
    ) -> None:
        """PartitionRecords for partitions ``first_id``, ``first_id + 1``, … of a topic (a new topic, or
        CreatePartitions growing one), replicas as ``assignment`` says.  A batch of values takes them
        encoded from their registrations (:func:`new_partition_value`: the same bytes, no upb message)."""
        add_partition = batch.add_partition
        if batch.values is None:
            for partition_id, record, registration in self._new_partitions(topic_id, first_id, assignment):
                add_partition(record, topic_id, partition_id, registration)
            return
        topic = topic_field(topic_id)
        for partition_id, registration in enumerate(self._new_registrations(assignment), first_id):
            value = new_partition_value(
                topic, partition_id, registration.replicas, registration.isr, registration.leader
            )
            add_partition(value, topic_id, partition_id, registration)

    def _new_partitions(
        self,
        topic_id: str,
        first_id: int,
        assignment: Sequence[tuple[int, ...]],
        *,
        placed_ids: bool = False,
    ) -> Iterator[tuple[int, pb.MetadataRecord, PartitionRegistration]]:
        """(partition id, PartitionRecord, the registration its replay gives) of new partitions.
        ``placed_ids``: as for :meth:`_new_registrations`."""
        registrations = self._new_registrations(assignment, placed_ids=placed_ids)
        for partition_id, registration in enumerate(registrations, first_id):
            record = pb.MetadataRecord()
            partition = record.partition
            partition.partition_id = partition_id
            partition.topic_id = topic_id
            partition.replicas.extend(registration.replicas)
            partition.isr.extend(registration.isr)
            partition.leader = registration.leader
            yield partition_id, record, registration

    def _new_registrations(
        self, assignment: Sequence[tuple[int, ...]], *, placed_ids: bool = False
    ) -> Iterator[PartitionRegistration]:
        """The registrations of new partitions with these replicas (what a PartitionRecord's replay
        gives).  ``placed_ids``: the tuples' ints are shared already (placement's), the tuples are
        shared as they are (:func:`shared_tuple`) instead of copied and interned (:func:`shared_ids`)."""
        acceptable = self.acceptable_in(self.image)
        all_acceptable = self.acceptable_ids().issuperset
        share = shared_tuple if placed_ids else shared_ids
        for replicas in assignment:
            # Kafka: the ISR of a new partition is its acceptable replicas (a fenced one joins on unfence);
            # the leader is the first of them (choose_leader with no current leader).  Almost always all
            # of them: then the ISR is the replica list itself (the bulk creation's path, ~0.8 us a
            # partition less than a call per replica) — the very tuple, which new_partition_value reads
            # as "the ISR's run is the replicas'".
            replica_ids = share(replicas)
            if replicas and all_acceptable(replicas):
                yield PartitionRegistration(replica_ids, replica_ids, replicas[0], 0, 0)
                continue
            isr = [r for r in replicas if acceptable(r)]
            leader = isr[0] if isr else NO_PARTITION_LEADER
            yield PartitionRegistration(
                replica_ids, replica_ids if len(isr) == len(replicas) else shared_ids(isr), leader, 0, 0
            )

    def delete_topics(
        self, req: cpb.DeleteTopicsRequest, next_offset: int
    ) -> Outcome[cpb.DeleteTopicsResponse]:
        response = cpb.DeleteTopicsResponse()
        try:
            self.check_cluster_id(req.cluster_id)
            check_delete_topics(req, self.settings.request_limits)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        batch = _Batch(self, next_offset)
        removed: set[str] = set()
        for name in req.names:
            result = response.topics.add(name=name)
            topic_id = self.image.topic_ids_by_name.get(name)
            if topic_id is None:
                error_response(result, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                continue
            result.topic_id = topic_id
            if topic_id not in removed:
                removed.add(topic_id)
                batch.add(pb.RemoveTopicRecord(topic_id=topic_id))
                job = self._topic_jobs.get(topic_id)
                if job is not None and job.reservation is not None:
                    # deleted while being written: its rest will never be (the job only closes the
                    # transaction), so it stops counting at once
                    job.reservation.release()
        return Outcome(batch.finish(), response, next_offset)

    def elect_leaders(
        self, req: cpb.ElectLeadersRequest, next_offset: int, scan: UncleanElectionScan | None = None
    ) -> Outcome[cpb.ElectLeadersResponse]:
        """Preferred or unclean leader election (``election_type``, Kafka's ElectionType) for the listed
        partitions (all when none are listed).

        PREFERRED moves leadership back to the first replica when it is live and in the ISR.  UNCLEAN
        (Kafka's ReplicationControlManager.electLeader) acts only on a partition without a leader: an
        eligible live replica (ISR, then ELR) is elected cleanly, else the first live replica uncleanly
        (RECOVERING, ISR = that leader alone) — whatever ``unclean.leader.election.enable`` says, which
        is the operator's way out of an offline partition.  Results are grouped by topic (the name once
        per topic, issue #15); an explicit request lists every partition it named, an implicit one only
        the partitions whose election was needed.

        ``scan`` (an implicit UNCLEAN request only): this is one part of it, resumed where ``scan`` says
        (:class:`UncleanElectionScan`, :meth:`_elect_unclean_part`); ``scan.done`` once it was the last.
        Without, the whole request runs in this one call."""
        response = cpb.ElectLeadersResponse()
        try:
            self.check_cluster_id(req.cluster_id)
            if req.election_type not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
                raise KraftError(
                    ErrorCode.INVALID_REQUEST,
                    f"unknown election type {req.election_type} (0 = preferred, 1 = unclean)",
                )
            check_elect_leaders(req, self.settings.request_limits, self._partition_count)
        except KraftError as exc:
            return Outcome([], error_response(response, exc.code, exc.message))
        unclean = req.election_type == UNCLEAN_ELECTION
        response.election_type = req.election_type  # what ran (a tool tells an older controller by 0)
        acceptable = self.acceptable_in(self.image)
        guard = guard_for(self.image)
        batch = _Batch(self, next_offset)
        explicit = bool(req.topic_partitions)
        targets: list[tuple[str, list[int]]] = []
        if explicit:
            for entry in req.topic_partitions:
                topic = self.image.topic(entry.topic)
                ids = list(entry.partitions) or (list(range(len(topic.partitions))) if topic else [0])
                targets.append((entry.topic, ids))
        elif unclean and scan is not None:
            return self._elect_unclean_part(response, next_offset, scan)
        elif unclean:
            # Only leaderless partitions can need an unclean election, and the rejoin index flags every
            # one of them (see rejoin_index): found without a scan of every partition, in scan order.
            leaderless: dict[str, list[int]] = {}
            for topic, partition_id, _ in self.rejoin_index.unsettled(self.image.topics_by_id, _leaderless):
                leaderless.setdefault(topic.name, []).append(partition_id)
            targets = list(leaderless.items())
        else:
            targets = [(t.name, list(range(len(t.partitions)))) for t in self.image.topics_by_id.values()]
        # A partition named twice gets its first result again, not a second record (decisions read the
        # image as it was before this request).
        decided: dict[tuple[str, int], tuple[ErrorCode, str]] = {}
        for name, partition_ids in targets:
            topic = self.image.topic(name)
            group: cpb.TopicElectionResults | None = None
            for partition_id in partition_ids:
                partition = None if topic is None else self.image.partition(topic.topic_id, partition_id)
                code, message = ErrorCode.NONE, ""
                if topic is None or partition is None:
                    code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic or partition"
                elif explicit and (topic.topic_id, partition_id) in decided:
                    code, message = decided[topic.topic_id, partition_id]
                elif unclean:
                    code, message = self._elect_unclean(
                        batch,
                        topic,
                        partition_id,
                        partition,
                        guard.for_partition(acceptable, topic.topic_id, partition_id)
                        if guard.active
                        else acceptable,
                    )
                elif partition.leader == partition.preferred_leader:
                    code, message = ErrorCode.ELECTION_NOT_NEEDED, "the preferred leader already leads"
                elif (
                    partition.preferred_leader not in partition.isr
                    or not acceptable(partition.preferred_leader)
                    or guard.offline(partition.preferred_leader, topic.topic_id, partition_id)
                ):
                    code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
                    message = f"preferred leader {partition.preferred_leader} is not live and in sync"
                else:
                    change = pb.PartitionChangeRecord(
                        topic_id=topic.topic_id, partition_id=partition_id, leader=partition.preferred_leader
                    )
                    batch.add(change)
                if explicit and topic is not None and partition is not None:
                    decided.setdefault((topic.topic_id, partition_id), (code, message))
                if explicit or code != ErrorCode.ELECTION_NOT_NEEDED:
                    if group is None:
                        group = response.topics.add(topic=name)
                    group.partitions.add(partition=partition_id, error_code=int(code), error_message=message)
        return Outcome(batch.finish(), response, next_offset)

    def _elect_unclean_part(
        self, response: cpb.ElectLeadersResponse, next_offset: int, scan: UncleanElectionScan
    ) -> Outcome[cpb.ElectLeadersResponse]:
        """One part of an implicit UNCLEAN ElectLeaders: the rejoin index made to follow the image (a
        slice of its rebuild, when stale, is a part of its own), then candidates ``CHECK_EVERY`` at a
        time from ``RejoinIndex.unsettled_ids`` — flagged or dirty partitions, nothing settled — each
        elected when it is leaderless in this part's image, until ``max.changes.per.write`` elections
        or the event's time budget.  Each partition is looked at once, in scan order: the results and
        records of all parts are one pass's, cut into pieces."""
        scan.parts += 1
        index = self.rejoin_index
        image = self.image
        if scan.index is not index:  # the first part, or a new logic (active again): from the start
            scan.index, scan.source, scan.taken, scan.position, scan.started = index, None, [], 0, False
        batch = _Batch(self, next_offset)
        deadline = batch.deadline
        if not index.follow_some(image.topics_by_id, INDEX_SLICE_PARTITIONS):
            return Outcome([], response, next_offset)
        if not scan.started:
            scan.source, scan.started = index.unsettled_ids(gaps=True), True
        topics = image.topics_by_id
        acceptable = self.acceptable_in(image)
        guard = guard_for(image)
        budget = self.settings.max_changes_per_write
        group: cpb.TopicElectionResults | None = None
        looked = 0
        last_id: str | None = None
        topic: TopicImage | None = None
        while batch.count() < budget:
            if scan.position >= len(scan.taken):
                if scan.source is None:  # the last take was short: nothing is left
                    scan.done = True
                    break
                if looked >= CHECK_EVERY and deadline.expired():
                    break  # (asked between two takes: the candidates taken go first)
                scan.taken, exhausted = _take_scan_candidates(scan.source)
                scan.position = 0
                if exhausted:
                    scan.source = None
                    continue
            topic_id, partition_id = scan.taken[scan.position]
            scan.position += 1
            looked += 1
            if partition_id == GAP:  # a window of the scan read with nothing unsettled (a take's last)
                looked += CHECK_EVERY  # its reads cost as much as a take: the deadline is asked next
                continue
            if topic_id != last_id:  # (a topic's candidates come together: one map lookup for them)
                last_id, topic = topic_id, topics.get(topic_id)
            if topic is None or partition_id >= len(topic.partitions):
                continue  # deleted since the scan began
            partition = topic.partitions[partition_id]
            if not _leaderless(partition):
                continue
            code, message = self._elect_unclean(
                batch,
                topic,
                partition_id,
                partition,
                guard.for_partition(acceptable, topic_id, partition_id) if guard.active else acceptable,
            )
            if group is None or group.topic != topic.name:
                group = response.topics.add(topic=topic.name)
            group.partitions.add(partition=partition_id, error_code=int(code), error_message=message)
        return Outcome(batch.finish(), response, next_offset)

    def _elect_unclean(
        self,
        batch: _Batch,
        topic: TopicImage,
        partition_id: int,
        partition: PartitionRegistration,
        acceptable: Callable[[int], bool],
    ) -> tuple[ErrorCode, str]:
        """One partition of an UNCLEAN ElectLeaders: the result, and the change added to ``batch``."""
        if partition.leader != NO_PARTITION_LEADER:
            return ErrorCode.ELECTION_NOT_NEEDED, f"the partition has a leader ({partition.leader})"
        min_isr, _ = self.election_rules(self.image, topic.name)
        # The rules of every other election, with the unclean fallback forced on (the request is the
        # operator's consent): an eligible live replica still wins over any other.
        change = build_change(
            topic.topic_id, partition_id, partition, acceptable, min_isr=min_isr, unclean_election=True
        )
        if change is None or not change.HasField("leader") or change.leader == NO_PARTITION_LEADER:
            return (
                ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                f"no replica of {list(partition.replicas)} is live",
            )
        note_unclean_election(topic.name, partition_id, partition, change)
        batch.add(change)
        return ErrorCode.NONE, ""

    def _partition_count(self, name: str) -> int:
        """Partitions an ElectLeaders entry without a partition list stands for (1 for an unknown topic:
        its one result says so)."""
        topic = self.image.topic(name)
        return 1 if topic is None else len(topic.partitions)

    # ---- reads ----

    def broker_state(self, broker: BrokerRegistration, now_ms: int) -> BrokerRegistrationState:
        if broker.fenced:
            if not self.heartbeats.has_valid_session(broker.broker_id, now_ms):
                return BrokerRegistrationState.OFFLINE
            return BrokerRegistrationState.FENCED
        if broker.in_controlled_shutdown:
            return BrokerRegistrationState.CONTROLLED_SHUTDOWN
        return BrokerRegistrationState.ACTIVE

    def describe_brokers(
        self, image: MetadataImage, now_ms: int, next_offset: int
    ) -> list[cpb.BrokerDescription]:
        """``next_offset``: the offset the log's next record gets; a broker's claim at or past it is
        described as -1 (unknown), not echoed (:func:`~kraft.metadata.heartbeats.applied_offset`)."""
        index = self.rejoin_index
        if index.current_for is image.topics_by_id:
            # The active controller's committed image is its speculative one once nothing is pending (its
            # own batches commit without replay): the index's counts are exact for it, and recounting
            # every topic a bulk operation touched (all of them, after a controlled shutdown) is not free.
            leaders, replicas = index.leader_counts, index.replica_counts
        else:
            counts = self._committed_counts
            counts.update(image.topics_by_id)
            leaders, replicas = counts.leaders, counts.replicas
        result = []
        for broker in sorted(image.brokers.values(), key=lambda b: b.broker_id):
            contact = self.heartbeats.contact(broker.broker_id)
            description = cpb.BrokerDescription(
                broker_id=broker.broker_id,
                broker_epoch=broker.epoch,
                incarnation_id=broker.incarnation_id,
                state=self.broker_state(broker, now_ms).value,
                endpoints=[
                    common_pb2.Endpoint(
                        name=e.name, host=e.host, port=e.port, security_protocol=e.security_protocol
                    )
                    for e in broker.endpoints
                ],
                metadata_offset=applied_offset(contact, next_offset),
                last_heartbeat_ms_ago=(
                    now_ms - contact.last_contact_ms if contact is not None and contact.heartbeats else -1
                ),
                leader_count=leaders.get(broker.broker_id, 0),
                replica_count=replicas.get(broker.broker_id, 0),
            )
            if broker.rack is not None:
                description.rack = broker.rack
            result.append(description)
        return result


def describe_topic(image: MetadataImage, topic: TopicImage, include_partitions: bool) -> cpb.TopicDescription:
    description = cpb.TopicDescription(name=topic.name, topic_id=topic.topic_id)
    for key, value in sorted(image.topic_configs(topic.name).items()):
        description.configs.add(name=key, value=value)
    if include_partitions:
        for partition_id, partition in enumerate(topic.partitions):
            description.partitions.add(
                partition=partition_id,
                leader=partition.leader,
                leader_epoch=partition.leader_epoch,
                partition_epoch=partition.partition_epoch,
                replicas=partition.replicas,
                isr=partition.isr,
                eligible_leader_replicas=partition.elr,
                last_known_elr=partition.last_known_elr,
                leader_recovery_state=partition.leader_recovery_state,
            )
    else:
        for partition_id, partition in enumerate(topic.partitions):
            description.partitions.add(partition=partition_id, replicas=partition.replicas)
    return description
