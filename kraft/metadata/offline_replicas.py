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

from collections.abc import Callable

from kraft.metadata.image import MetadataImage, PartitionRegistration

IsAcceptable = Callable[[int], bool]


class OfflineReplicaGuard:
    """The offline replicas of an image's brokers, for elections over its partitions.

    Built per slice of work (one pass over the brokers, not the partitions).  :meth:`for_partition` returns
    the broker-level predicate itself when no broker has an offline dir (the usual case: the hot paths stay
    as they were) or when none of the partition's replicas is offline; otherwise a predicate that also
    refuses those replicas — one set lookup per replica of the partition, never a scan."""

    __slots__ = ("_offline", "active")

    def __init__(self, image: MetadataImage) -> None:
        self._offline = {
            broker.broker_id: broker.offline_replicas
            for broker in image.brokers.values()
            if broker.offline_replicas
        }
        self.active = bool(self._offline)
        """Whether some broker has a replica on an offline dir (callers skip the guard when not)."""

    def offline(self, broker_id: int, topic_id: str, partition_id: int) -> bool:
        """Whether ``broker_id``'s replica of the partition is on a log dir it took offline."""
        replicas = self._offline.get(broker_id)
        return replicas is not None and (topic_id, partition_id) in replicas

    def for_partition(
        self, acceptable: IsAcceptable, topic_id: str, partition_id: int, partition: PartitionRegistration
    ) -> IsAcceptable:
        """``acceptable`` narrowed to the replicas of the partition that are on an online dir."""
        offline = self._offline
        if not offline:
            return acceptable
        key = (topic_id, partition_id)
        members = (*partition.replicas, *partition.isr, *partition.elr)  # any candidate of an election
        excluded = frozenset(r for r in members if r in offline and key in offline[r])
        if not excluded:
            return acceptable

        def online_and_acceptable(broker_id: int) -> bool:
            return broker_id not in excluded and acceptable(broker_id)

        return online_and_acceptable
