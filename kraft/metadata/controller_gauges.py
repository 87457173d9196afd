"""The controller's image gauges: cheap ones at every commit, partition ones by a periodic scan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from kraft.metadata.controller_state import YIELD_EVERY_RECORDS, ControllerState
from kraft.metadata.image import NO_PARTITION_LEADER, BrokerRegistration
from kraft.metadata.timers import Timers
from kraft.observability.metrics import ControllerMetrics

PARTITION_METRICS_INTERVAL_MS = 5_000


class ControllerGauges:
    def __init__(self, state: ControllerState, timers: Timers, metrics: ControllerMetrics) -> None:
        self._state = state
        self._timers = timers
        self._metrics = metrics
        self._counted_brokers: Mapping[int, BrokerRegistration] | None = None

    def on_commit(self) -> None:
        image = self._state.committed
        m = self._metrics
        m.last_applied_record_offset.set(image.offset)
        m.last_committed_record_offset.set(image.offset)
        if image.brokers is not self._counted_brokers:
            self._counted_brokers = image.brokers
            fenced = sum(1 for b in image.brokers.values() if b.fenced)
            m.fenced_broker_count.set(fenced)
            m.active_broker_count.set(len(image.brokers) - fenced)
        m.global_topic_count.set(len(image.topics_by_id))

    async def run_partition_scans(self) -> None:
        """Partition gauges need a full scan: done every few seconds, yielding while it runs."""
        scanned_topics: object = None
        while True:
            await self._timers.sleep_ms(PARTITION_METRICS_INTERVAL_MS)
            image = self._state.committed
            if image.topics_by_id is scanned_topics:
                continue
            scanned_topics = image.topics_by_id
            partitions = offline = imbalance = 0
            for topic in image.topics_by_id.values():
                for p in topic.partitions:
                    offline += p.leader == NO_PARTITION_LEADER
                    imbalance += p.leader != p.preferred_leader
                partitions += len(topic.partitions)
                if partitions % YIELD_EVERY_RECORDS < len(topic.partitions):
                    await asyncio.sleep(0)
            self._metrics.global_partition_count.set(partitions)
            self._metrics.offline_partitions_count.set(offline)
            self._metrics.preferred_replica_imbalance_count.set(imbalance)
