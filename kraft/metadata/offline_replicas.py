"""Replicas on an offline log dir are never elected (pure; kraft's form of KIP-858's ``hasOnlineDir``).

A broker that takes a log dir offline (JBOD: an I/O error on it) keeps running and stays unfenced with its
other dirs, and names the partitions it had there in every heartbeat.  The controller writes them into the
broker's registration (``BrokerRegistrationChangeRecord.offline_replicas`` →
``BrokerRegistration.offline_replicas``), so every active controller, including one elected after a
failover, knows them from the log.  Such a replica leaves the ISR and, like any departing member, joins the
ELR — its data is unreachable, not known lost — but while the registration lists it, it is not an
acceptable leader of that partition, whatever the election (from the ISR, from the ELR, unclean), and it
may not join the ISR.  A restart on repaired dirs re-registers the broker (an empty set) and proves its
incarnation as any restart does, so the replica, still in the ELR, is electable again.

Kafka keeps a directory id per replica in the partition and the online dirs in the registration; kraft's
metadata holds no replica-to-directory assignment, so the registration holds the replicas themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kraft.metadata.image import BrokerRegistration, MetadataImage

IsAcceptable = Callable[[int], bool]


class OfflineReplicaGuard:
    """The offline replicas of an image's brokers, for elections over its partitions.

    Indexed once per registrations mapping (:func:`guard_for` reuses it while ``image.brokers`` is the
    same object: partition changes do not touch it), in proportion to the offline replicas, never to the
    partitions.  :meth:`for_partition` returns the broker-level predicate itself when no replica of the
    partition is offline (at most two dict lookups; callers skip even that while :attr:`active` is
    False, the usual case), otherwise one that also refuses those replicas."""

    __slots__ = ("_by_topic", "_offline", "active")

    def __init__(self, brokers: Mapping[int, BrokerRegistration]) -> None:
        self._offline = {b.broker_id: b.offline_replicas for b in brokers.values() if b.offline_replicas}
        by_topic: dict[str, dict[int, tuple[int, ...]]] = {}
        for broker_id, replicas in self._offline.items():
            for topic_id, partition_id in replicas:
                partitions = by_topic.setdefault(topic_id, {})
                partitions[partition_id] = (*partitions.get(partition_id, ()), broker_id)
        self._by_topic = by_topic
        self.active = bool(self._offline)
        """Whether some broker has a replica on an offline dir (callers skip the guard when not)."""

    def offline(self, broker_id: int, topic_id: str, partition_id: int) -> bool:
        """Whether ``broker_id``'s replica of the partition is on a log dir it took offline."""
        replicas = self._offline.get(broker_id)
        return replicas is not None and (topic_id, partition_id) in replicas

    def for_partition(self, acceptable: IsAcceptable, topic_id: str, partition_id: int) -> IsAcceptable:
        """``acceptable`` narrowed to the brokers whose replica of the partition is on an online dir."""
        partitions = self._by_topic.get(topic_id)
        excluded = None if partitions is None else partitions.get(partition_id)
        if excluded is None:
            return acceptable
        if len(excluded) == 1:
            (gone,) = excluded

            def online_and_acceptable(broker_id: int) -> bool:
                return broker_id != gone and acceptable(broker_id)

            return online_and_acceptable

        def all_online_and_acceptable(broker_id: int) -> bool:
            return broker_id not in excluded and acceptable(broker_id)

        return all_online_and_acceptable


_NO_GUARD = OfflineReplicaGuard({})
_last: list[tuple[Mapping[int, BrokerRegistration], OfflineReplicaGuard]] = []


def guard_for(image: MetadataImage) -> OfflineReplicaGuard:
    """The guard of ``image``'s registrations: built again only when they changed (a bulk job asks per
    slice, on a new image each time, whose ``brokers`` is usually the previous one's)."""
    brokers = image.brokers
    if _last and _last[0][0] is brokers:
        return _last[0][1]
    if not any(b.offline_replicas for b in brokers.values()):
        guard = _NO_GUARD
    else:
        guard = OfflineReplicaGuard(brokers)
    _last[:] = [(brokers, guard)]
    return guard
