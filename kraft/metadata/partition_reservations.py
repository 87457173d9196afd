"""Partitions reserved by topics still being created, for the partition limits (issue #17).

A big topic is counted against ``max.partitions`` / ``max.broker.partitions`` with all its partitions
when it is planned, but written in slices over many events (inside a metadata transaction), and a
prepared topic is placed in events before its one write.  Meanwhile every other CreateTopics and
CreatePartitions must be checked as if the pending topic's partitions already existed, or the two
together could exceed a limit by up to the unwritten rest.  A :class:`Reservation` holds a pending
topic's partitions not yet in the image — their count and their replicas per broker — and
:class:`PartitionReservations` keeps the totals over all reservations, so that a check costs O(1) for
the cluster and O(1) per broker it looks at, never O(partitions).

A plan's own check for its write counts the reservations of writes under way and of plans made before
it, not of plans made after it (:meth:`PartitionReservations.planned_after`): the topics of one request
of many prepared topics are admitted in request order, as the unsliced request admits them, instead of
the first being refused for the room the later ones hold.

Soft state of the active controller: cleared with the logic's other pending state on ``reset``; a new
active controller rebuilds the reservation of a transaction it resumes from the plan in the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from kraft.metadata.placement import UsableBroker, rack_count


class Reservation:
    """One pending topic's partitions not in the image yet, and their replicas per broker as far as
    known (a plan counts its placement in slices: :meth:`add_replicas`).  Released exactly once
    (:meth:`release`, idempotent); a reservation of a cleared registry does nothing."""

    __slots__ = ("_owner", "partitions", "planned", "replicas", "seq")

    def __init__(self, owner: PartitionReservations, partitions: int, seq: int, planned: bool) -> None:
        self._owner = owner
        self.partitions = partitions
        self.replicas: Counter[int] = Counter()
        self.seq = seq
        """Order of reservation (plans made later have larger ones)."""
        self.planned = planned
        """A plan waiting for its write (yields to earlier ones), not a write under way."""

    @property
    def held(self) -> bool:
        return self in self._owner._held

    def add_replicas(self, placed: Iterable[tuple[int, ...]]) -> None:
        """Replicas of partitions counted (placed, not written): they now count per broker."""
        if not self.held:
            return
        counted = Counter(b for replicas in placed for b in replicas)
        self.replicas.update(counted)
        self._owner._replicas.update(counted)

    def set_replicas(self, by_broker: Mapping[int, int]) -> None:
        """Replace the per-broker counts (a conservative bound replaced by the exact count): O(brokers)."""
        if not self.held:
            return
        owner = self._owner
        before = self.replicas
        owner._replicas.subtract(before)
        self.replicas = Counter(by_broker)
        owner._replicas.update(self.replicas)
        owner._drop_zeros(before.keys() | self.replicas.keys())

    def consume(self, written: Iterable[tuple[int, ...]]) -> None:
        """Partitions now written (in the image): they stop counting as reserved, O(their replicas)."""
        if not self.held:
            return
        owner = self._owner
        count = 0
        for replicas in written:
            count += 1
            for broker_id in replicas:
                # never below zero: a conservative bound may be smaller than a broker's actual share
                if self.replicas[broker_id] > 0:
                    self.replicas[broker_id] -= 1
                    owner._replicas[broker_id] -= 1
        count = min(count, self.partitions)
        self.partitions -= count
        owner._partitions -= count

    def release(self) -> None:
        """The topic is written, deleted, undone or refused: nothing of it is reserved any more."""
        if not self.held:
            return
        owner = self._owner
        owner._held.discard(self)
        owner._partitions -= self.partitions
        owner._replicas.subtract(self.replicas)
        owner._drop_zeros(self.replicas.keys())
        self.partitions = 0
        self.replicas = Counter()


class PartitionReservations:
    """Totals over the held reservations: :attr:`partitions` (each reserved partition once) and
    :meth:`replicas_on` (reserved replicas on one broker)."""

    def __init__(self) -> None:
        self._held: set[Reservation] = set()
        self._partitions = 0
        self._replicas: Counter[int] = Counter()
        self._seq = 0

    def reserve(
        self, partitions: int, by_broker: Mapping[int, int] | None = None, *, planned: bool = False
    ) -> Reservation:
        """Hold ``partitions`` (and ``by_broker`` replicas): ``planned`` for a plan waiting for its write,
        otherwise a write under way (an admitted topic, counted by every check)."""
        self._seq += 1
        reservation = Reservation(self, partitions, self._seq, planned)
        self._held.add(reservation)
        self._partitions += partitions
        if by_broker:
            reservation.replicas.update(by_broker)
            self._replicas.update(by_broker)
        return reservation

    @property
    def partitions(self) -> int:
        return self._partitions

    def replicas_on(self, broker_id: int) -> int:
        return self._replicas.get(broker_id, 0)

    def next_seq(self) -> int:
        """The order the next reservation will get (a dry-run plan takes its place without one)."""
        return self._seq + 1

    def planned_after(self, seq: int) -> tuple[int, Counter[int]]:
        """Partitions and replicas per broker held by plans made after ``seq`` (still waiting for their
        write): a plan's own check leaves them out.  O(pending reservations and their brokers), once per
        plan's write."""
        partitions = 0
        replicas: Counter[int] = Counter()
        for reservation in self._held:
            if reservation.planned and reservation.seq > seq:
                partitions += reservation.partitions
                replicas.update(reservation.replicas)
        return partitions, replicas

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        """Drop every reservation (a reset: pending work is gone or rebuilt); their later calls are no-ops."""
        self._held.clear()
        self._partitions = 0
        self._replicas.clear()

    def _drop_zeros(self, brokers: Iterable[int]) -> None:
        replicas = self._replicas
        for broker_id in list(brokers):
            if replicas.get(broker_id, 0) <= 0:
                replicas.pop(broker_id, None)


def placement_bound(
    brokers: Sequence[UsableBroker], partitions: int, replication_factor: int
) -> dict[int, int]:
    """An upper bound, per broker, of the replicas that ``partitions`` consecutive partitions of a plan
    place on it (:func:`kraft.metadata.placement.place_ordered_range`), in O(brokers) — for a resumed
    plan until its exact count is known.  Without racks (one rack) each block of ``len(brokers)``
    partitions sharing a follower shift puts exactly ``replication_factor`` replicas on every broker, and
    the range touches at most ``partitions // len(brokers) + 2`` blocks; with racks, a broker alone in its
    rack may be picked for nearly every partition, so only ``partitions`` (one replica each) bounds it."""
    if not brokers:
        return {}
    bound = partitions
    if rack_count(brokers) == 1:
        bound = min(partitions, replication_factor * (partitions // len(brokers) + 2))
    return {broker.broker_id: bound for broker in brokers}
