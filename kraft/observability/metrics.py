"""Prometheus metrics: Kafka's KRaft metric names translated to Prometheus conventions, defined once.

Kafka's ``raft-metrics`` / ``kafka.controller`` / broker metadata metrics become ``kraft_raft_*``,
``kraft_controller_*`` and ``kraft_broker_*``; every series carries a ``node`` label so several nodes can
share one process (tests, the simulator).  Latencies are histograms in seconds (Prometheus convention)
instead of Kafka's avg/max in ms; Kafka's ``*-rate`` metrics are counters (``rate()`` them), and
``poll-idle-ratio-avg`` is ``rate(kraft_raft_poll_idle_seconds_total)``.

Hot paths should bind once and keep the children: ``m = RaftMetrics.for_node(1)`` then
``m.high_watermark.set(hwm)`` — a ``.labels()`` lookup per update takes a lock and a dict lookup.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.registry import CollectorRegistry

from kraft.observability.http_server import HttpLimits, serve

# No ``*_created`` series: they double what a scrape carries for every counter and histogram child (one
# Unix timestamp per series, which Prometheus itself ignores — it derives resets from the values), and
# Kafka has no such metric.  prometheus_client reads this flag when it renders, so it holds for every
# registry of the process.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client 0.26

# Raft quorum states as Kafka names them (KIP-595 + KIP-996); exactly one is 1 per node.
RAFT_STATES: Final = ("unattached", "prospective", "candidate", "leader", "follower", "resigned")
_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_NODE: Final = ("node",)

# --- Raft (Kafka: raft-metrics) ---
RAFT_CURRENT_STATE = Gauge(
    "kraft_raft_current_state", "1 for the node's current Raft state, 0 for the others", (*_NODE, "state")
)
RAFT_CURRENT_LEADER = Gauge("kraft_raft_current_leader", "Id of the known leader, -1 if unknown", _NODE)
RAFT_CURRENT_EPOCH = Gauge("kraft_raft_current_epoch", "Current quorum epoch", _NODE)
RAFT_CURRENT_VOTE = Gauge("kraft_raft_current_vote", "Id voted for in the current epoch, -1 if none", _NODE)
RAFT_HIGH_WATERMARK = Gauge(
    "kraft_raft_high_watermark", "High watermark (committed offset), -1 if unknown", _NODE
)
RAFT_LOG_END_OFFSET = Gauge("kraft_raft_log_end_offset", "Offset after the last record in the log", _NODE)
RAFT_COMMIT_LATENCY = Histogram(
    "kraft_raft_commit_latency_seconds",
    "Time from a leader append to its commit (Kafka commit-latency)",
    _NODE,
    buckets=_LATENCY_BUCKETS,
)
RAFT_ELECTION_LATENCY = Histogram(
    "kraft_raft_election_latency_seconds",
    "Time from starting an election to electing a leader (Kafka election-latency)",
    _NODE,
    buckets=_LATENCY_BUCKETS,
)
RAFT_FETCH_TURNAROUND = Histogram(
    "kraft_raft_fetch_turnaround_seconds",
    "Follower: time from a successful Fetch response to sending the next Fetch (append, fsync, hand-off)",
    _NODE,
    buckets=_LATENCY_BUCKETS,
)
RAFT_LEADERSHIP_CONFIRMATIONS = Counter(
    "kraft_raft_leadership_confirmations",
    "Leader: leadership confirmations asked for, by how they were answered: lease (at once, from the "
    "check-quorum lease), lease_lapsed (a caller that may use the lease waited for a round: it had "
    "lapsed) or round (a caller that always waits for a round, e.g. a linearizable read)",
    (*_NODE, "how"),
)
RAFT_CONFIRMATION_ROUND_SECONDS = Histogram(
    "kraft_raft_confirmation_round_seconds",
    "Leader: time from asking for a leadership-confirmation round to its confirmation (once per round "
    "a caller waited on)",
    _NODE,
    buckets=_LATENCY_BUCKETS,
)
RAFT_APPEND_RECORDS = Counter("kraft_raft_append_records", "Records appended by the leader", _NODE)
RAFT_FETCH_RECORDS = Counter("kraft_raft_fetch_records", "Records fetched from the leader", _NODE)
RAFT_POLL_IDLE_SECONDS = Counter(
    "kraft_raft_poll_idle_seconds", "Time the Raft driver spent idle waiting for work", _NODE
)
RAFT_INPUTS_DURING_FLUSH = Counter(
    "kraft_raft_inputs_during_flush",
    "Inputs fed to the Raft core while its log fsync ran (a leader's Fetches, its answers to parked ones)",
    _NODE,
)
RAFT_LEASE_ECHO_BASIS_AGE = Histogram(
    "kraft_raft_lease_echo_basis_age_seconds",
    "Leader: for each echo that renewed a voter's lease basis, how old that basis was when the echo "
    "counted (the lease's echo path; the lease lapses if a majority's is over the lease)",
    _NODE,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 1.0),
)

# --- Controller (Kafka: kafka.controller:type=KafkaController) ---
CONTROLLER_ACTIVE_CONTROLLER_COUNT = Gauge(
    "kraft_controller_active_controller_count", "1 on the active controller, 0 elsewhere", _NODE
)
CONTROLLER_FENCED_BROKER_COUNT = Gauge(
    "kraft_controller_fenced_broker_count", "Registered fenced brokers", _NODE
)
CONTROLLER_ACTIVE_BROKER_COUNT = Gauge("kraft_controller_active_broker_count", "Unfenced brokers", _NODE)
CONTROLLER_GLOBAL_TOPIC_COUNT = Gauge("kraft_controller_global_topic_count", "Topics in the image", _NODE)
CONTROLLER_GLOBAL_PARTITION_COUNT = Gauge(
    "kraft_controller_global_partition_count", "Partitions in the image", _NODE
)
CONTROLLER_OFFLINE_PARTITIONS_COUNT = Gauge(
    "kraft_controller_offline_partitions_count", "Partitions without a live leader", _NODE
)
CONTROLLER_PREFERRED_REPLICA_IMBALANCE_COUNT = Gauge(
    "kraft_controller_preferred_replica_imbalance_count",
    "Partitions not led by their preferred replica",
    _NODE,
)
CONTROLLER_TIMED_OUT_BROKER_HEARTBEATS = Counter(
    "kraft_controller_timed_out_broker_heartbeats", "Brokers fenced because their session expired", _NODE
)
CONTROLLER_HEARTBEATS_FAST_LANE = Counter(
    "kraft_controller_heartbeats_fast_lane",
    "Steady broker heartbeats answered on the request plane's thread, without the main loop",
    _NODE,
)
CONTROLLER_HEARTBEATS_SLOW_PATH = Counter(
    "kraft_controller_heartbeats_slow_path",
    "Broker heartbeats the fast lane sent to the main loop, by reason (no_snapshot, no_lease, lease_lapsed, "
    "asks, other_cluster, not_steady, uncommitted, changed, not_allowed; docs/internals/heartbeat-lane.md)",
    (*_NODE, "reason"),
)
CONTROLLER_HEARTBEAT_SLOW_PATH_SECONDS = Histogram(
    "kraft_controller_heartbeat_slow_path_seconds",
    "With the fast lane on: time from a heartbeat's arrival on the intake thread to its answer, for those "
    "that went the main loop's path",
    _NODE,
    buckets=_LATENCY_BUCKETS,
)
CONTROLLER_LAST_APPLIED_RECORD_OFFSET = Gauge(
    "kraft_controller_last_applied_record_offset", "Offset of the last record applied to the image", _NODE
)
CONTROLLER_LAST_COMMITTED_RECORD_OFFSET = Gauge(
    "kraft_controller_last_committed_record_offset", "Offset of the last committed record", _NODE
)
CONTROLLER_LAST_APPLIED_RECORD_LAG_SECONDS = Gauge(
    "kraft_controller_last_applied_record_lag_seconds", "Now minus the last applied record's timestamp", _NODE
)
CONTROLLER_NEW_ACTIVE_CONTROLLERS = Counter(
    "kraft_controller_new_active_controllers", "Times a new active controller was observed", _NODE
)
CONTROLLER_METADATA_ERRORS = Counter(
    "kraft_controller_metadata_errors", "Errors while replaying or generating metadata records", _NODE
)
CONTROLLER_EVENT_PROCESSING_TIME = Histogram(
    "kraft_controller_event_queue_processing_time_seconds",
    "Time one event of the controller's event queue ran, by kind (Kafka EventQueueProcessingTimeMs); "
    "measured in whole milliseconds of the controller's clock",
    (*_NODE, "kind"),
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
CONTROLLER_EVENT_LONGEST = Gauge(
    "kraft_controller_event_queue_longest_event_seconds",
    "The longest event of the controller's event queue, by kind, since the start of the current "
    "60-second window (a window starts with the first event after the previous one ended)",
    (*_NODE, "kind"),
)
# --- the process (Python's cyclic GC; kraft.observability.gc_watch) ---
GC_PAUSE_SECONDS = Histogram(
    "kraft_gc_pause_seconds",
    "Time one collection of the cyclic garbage collector ran, by generation (0 and 1 are the young "
    "generations, 2 a full collection over everything not frozen)",
    ("generation",),
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
)


# --- Broker (Kafka: broker-metadata-metrics) ---
BROKER_STATE = Gauge("kraft_broker_state", "BrokerState as Kafka numbers it (3 = RUNNING)", _NODE)
BROKER_LAST_APPLIED_RECORD_OFFSET = Gauge(
    "kraft_broker_last_applied_record_offset", "Offset of the last metadata record applied", _NODE
)
BROKER_LAST_APPLIED_RECORD_LAG_SECONDS = Gauge(
    "kraft_broker_last_applied_record_lag_seconds", "Now minus the last applied record's timestamp", _NODE
)
BROKER_METADATA_LAG_RECORDS = Gauge(
    "kraft_broker_metadata_lag_records", "Controller high watermark minus the broker's applied offset", _NODE
)
BROKER_METADATA_APPLY_ERRORS = Counter(
    "kraft_broker_metadata_apply_errors",
    "Errors applying metadata deltas (Kafka metadata-apply-error-count)",
    _NODE,
)
BROKER_OFFLINE_LOG_DIRS = Gauge(
    "kraft_broker_offline_log_dirs",
    "Log dirs taken offline after an I/O or corruption error, until a restart (OfflineLogDirectoryCount)",
    _NODE,
)

# --- Broker replication (Kafka: kafka.server ReplicaManager / ReplicaFetcherManager) ---
REPLICA_LEADER_COUNT = Gauge("kraft_broker_leader_count", "Partitions this broker leads (LeaderCount)", _NODE)
REPLICA_PARTITION_COUNT = Gauge(
    "kraft_broker_partition_count", "Partition replicas this broker hosts (PartitionCount)", _NODE
)
REPLICA_UNDER_REPLICATED_PARTITIONS = Gauge(
    "kraft_broker_under_replicated_partitions",
    "Partitions led here whose ISR is smaller than their replica set (UnderReplicatedPartitions)",
    _NODE,
)
REPLICA_UNDER_MIN_ISR_PARTITION_COUNT = Gauge(
    "kraft_broker_under_min_isr_partition_count",
    "Partitions led here whose ISR is below min.insync.replicas (UnderMinIsrPartitionCount)",
    _NODE,
)
REPLICA_AT_MIN_ISR_PARTITION_COUNT = Gauge(
    "kraft_broker_at_min_isr_partition_count",
    "Partitions led here whose ISR is exactly min.insync.replicas (AtMinIsrPartitionCount)",
    _NODE,
)
REPLICA_ISR_SHRINKS = Counter(
    "kraft_broker_isr_shrinks",
    "Committed ISR changes of partitions led here that removed replicas (IsrShrinksPerSec: rate() it)",
    _NODE,
)
REPLICA_ISR_EXPANDS = Counter(
    "kraft_broker_isr_expands",
    "Committed ISR changes of partitions led here that added replicas (IsrExpandsPerSec: rate() it)",
    _NODE,
)
REPLICA_FETCHER_MAX_LAG = Gauge(
    "kraft_broker_replica_fetcher_max_lag",
    "Largest lag in records of a partition this broker follows: the leader's log end at the last fetch "
    "minus the local log end (ReplicaFetcherManager MaxLag)",
    _NODE,
)
REPLICA_FETCHER_BYTES = Counter(
    "kraft_broker_replica_fetcher_bytes", "Record batch bytes copied from leaders (BytesPerSec)", _NODE
)

# --- Broker requests (Kafka: kafka.server:type=BrokerTopicMetrics, kafka.network:type=RequestMetrics) ---
# Each counter twice: all topics (Kafka's series without a topic tag) and per topic.  Per-topic series
# exist only for topics in the broker's metadata image and go when the topic does, so a client naming
# random topics cannot grow the exposition; requests for unknown topics count in the totals only.
_TOPIC: Final = (*_NODE, "topic")
_REQUEST_COUNTERS: Final = (
    ("messages_in", "Records appended by Produce requests (MessagesInPerSec)"),
    (
        "bytes_in",
        "Bytes of the Produce requests that appended records, as received on the wire (BytesInPerSec)",
    ),
    (
        "bytes_out",
        "Bytes of the records Fetch responses carried to consumers: keys and values plus 64 bytes a record "
        "for framing, an upper bound of the wire size (BytesOutPerSec)",
    ),
    ("produce_requests", "Produce requests answered (TotalProduceRequestsPerSec)"),
    ("fetch_requests", "Fetch requests answered (TotalFetchRequestsPerSec)"),
    ("failed_produce_requests", "Produce requests answered with an error (FailedProduceRequestsPerSec)"),
    ("failed_fetch_requests", "Fetch requests answered with an error (FailedFetchRequestsPerSec)"),
)
BROKER_REQUEST_TOTALS: Final = {
    name: Counter(f"kraft_broker_{name}", f"{text}, all topics", _NODE) for name, text in _REQUEST_COUNTERS
}
BROKER_REQUEST_TOPICS: Final = {
    name: Counter(f"kraft_broker_topic_{name}", f"{text}, per topic", _TOPIC)
    for name, text in _REQUEST_COUNTERS
}
BROKER_REQUEST_LATENCY = Histogram(
    "kraft_broker_request_latency_seconds",
    "Time from receiving a Produce or Fetch request to answering it, a Fetch's long-poll and an acks=all "
    "Produce's wait for the ISR included (RequestMetrics TotalTimeMs)",
    (*_NODE, "request"),
    buckets=_LATENCY_BUCKETS,
)


# --- intake processes (controller.intake.processes; kraft/node/intake_batch.py) ---
# An intake process's own counts reach its node in periodic reports over the node's unix socket (the
# children serve no metrics of their own: one scrape target per node); ``intake`` is the child's index.
_INTAKE: Final = (*_NODE, "intake")
_INTAKE_COUNTERS: Final = (
    ("append_batches", "TestAppend batches an intake process sent (one TestAppendStream message each)"),
    ("append_calls", "TestAppend calls an intake process answered from its batches"),
    ("controller_batches", "CallBatch messages an intake process sent (ControllerService calls of a turn)"),
    ("controller_calls", "ControllerService calls an intake process sent in CallBatch messages"),
    ("proxied_calls", "Calls an intake process proxied byte for byte (every other method)"),
    ("stream_messages", "TestAppendStream messages an intake process answered through its batcher"),
    (
        "proxied_answers",
        "Messages the streams an intake process proxied answered (BrokerHeartbeatStream: one per heartbeat)",
    ),
)
INTAKE_COUNTERS: Final = {
    name: Counter(f"kraft_intake_{name}", text, _INTAKE) for name, text in _INTAKE_COUNTERS
}
INTAKE_RECEIVED_BATCHES = Counter(
    "kraft_intake_received_batches", "CallBatch messages the node received from its intake processes", _NODE
)
INTAKE_RECEIVED_CALLS = Counter(
    "kraft_intake_received_calls", "ControllerService calls the node received in CallBatch messages", _NODE
)
INTAKE_CANCELLED_CALLS = Counter(
    "kraft_intake_cancelled_calls",
    "Calls of CallBatch messages the node cancelled (or never started) because their callers left",
    _NODE,
)


@dataclass(frozen=True, slots=True)
class RaftMetrics:
    """The Raft series of one node, bound once (label lookups are not free)."""

    node: str
    current_leader: Gauge
    current_epoch: Gauge
    current_vote: Gauge
    high_watermark: Gauge
    log_end_offset: Gauge
    commit_latency: Histogram
    election_latency: Histogram
    fetch_turnaround: Histogram
    confirmations_lease: Counter
    confirmations_lease_lapsed: Counter
    confirmations_round: Counter
    confirmation_round: Histogram
    append_records: Counter
    fetch_records: Counter
    poll_idle_seconds: Counter
    inputs_during_flush: Counter
    lease_echo_basis_age: Histogram

    @classmethod
    def for_node(cls, node: int | str) -> RaftMetrics:
        label = str(node)
        metrics = cls(
            node=label,
            current_leader=RAFT_CURRENT_LEADER.labels(label),
            current_epoch=RAFT_CURRENT_EPOCH.labels(label),
            current_vote=RAFT_CURRENT_VOTE.labels(label),
            high_watermark=RAFT_HIGH_WATERMARK.labels(label),
            log_end_offset=RAFT_LOG_END_OFFSET.labels(label),
            commit_latency=RAFT_COMMIT_LATENCY.labels(label),
            election_latency=RAFT_ELECTION_LATENCY.labels(label),
            fetch_turnaround=RAFT_FETCH_TURNAROUND.labels(label),
            confirmations_lease=RAFT_LEADERSHIP_CONFIRMATIONS.labels(label, "lease"),
            confirmations_lease_lapsed=RAFT_LEADERSHIP_CONFIRMATIONS.labels(label, "lease_lapsed"),
            confirmations_round=RAFT_LEADERSHIP_CONFIRMATIONS.labels(label, "round"),
            confirmation_round=RAFT_CONFIRMATION_ROUND_SECONDS.labels(label),
            append_records=RAFT_APPEND_RECORDS.labels(label),
            fetch_records=RAFT_FETCH_RECORDS.labels(label),
            poll_idle_seconds=RAFT_POLL_IDLE_SECONDS.labels(label),
            inputs_during_flush=RAFT_INPUTS_DURING_FLUSH.labels(label),
            lease_echo_basis_age=RAFT_LEASE_ECHO_BASIS_AGE.labels(label),
        )
        metrics.current_leader.set(-1)
        metrics.current_vote.set(-1)
        metrics.high_watermark.set(-1)
        return metrics

    def set_state(self, state: str) -> None:
        """Mark ``state`` (one of :data:`RAFT_STATES`, case-insensitive) as current, the others 0."""
        current = state.lower()
        for name in RAFT_STATES:
            RAFT_CURRENT_STATE.labels(self.node, name).set(1 if name == current else 0)
        if current not in RAFT_STATES:
            RAFT_CURRENT_STATE.labels(self.node, current).set(1)


@dataclass(frozen=True, slots=True)
class ControllerMetrics:
    """The controller series of one node."""

    active_controller_count: Gauge
    fenced_broker_count: Gauge
    active_broker_count: Gauge
    global_topic_count: Gauge
    global_partition_count: Gauge
    offline_partitions_count: Gauge
    preferred_replica_imbalance_count: Gauge
    timed_out_broker_heartbeats: Counter
    heartbeats_fast_lane: Counter
    heartbeats_slow_path: Callable[[str], Counter]
    """The ``kraft_controller_heartbeats_slow_path_total`` child of a reason (bind once, keep it)."""
    heartbeat_slow_path_seconds: Histogram
    last_applied_record_offset: Gauge
    last_committed_record_offset: Gauge
    last_applied_record_lag_seconds: Gauge
    new_active_controllers: Counter
    metadata_errors: Counter

    @classmethod
    def for_node(cls, node: int | str) -> ControllerMetrics:
        label = str(node)
        return cls(
            active_controller_count=CONTROLLER_ACTIVE_CONTROLLER_COUNT.labels(label),
            fenced_broker_count=CONTROLLER_FENCED_BROKER_COUNT.labels(label),
            active_broker_count=CONTROLLER_ACTIVE_BROKER_COUNT.labels(label),
            global_topic_count=CONTROLLER_GLOBAL_TOPIC_COUNT.labels(label),
            global_partition_count=CONTROLLER_GLOBAL_PARTITION_COUNT.labels(label),
            offline_partitions_count=CONTROLLER_OFFLINE_PARTITIONS_COUNT.labels(label),
            preferred_replica_imbalance_count=CONTROLLER_PREFERRED_REPLICA_IMBALANCE_COUNT.labels(label),
            timed_out_broker_heartbeats=CONTROLLER_TIMED_OUT_BROKER_HEARTBEATS.labels(label),
            heartbeats_fast_lane=CONTROLLER_HEARTBEATS_FAST_LANE.labels(label),
            heartbeats_slow_path=functools.partial(CONTROLLER_HEARTBEATS_SLOW_PATH.labels, label),
            heartbeat_slow_path_seconds=CONTROLLER_HEARTBEAT_SLOW_PATH_SECONDS.labels(label),
            last_applied_record_offset=CONTROLLER_LAST_APPLIED_RECORD_OFFSET.labels(label),
            last_committed_record_offset=CONTROLLER_LAST_COMMITTED_RECORD_OFFSET.labels(label),
            last_applied_record_lag_seconds=CONTROLLER_LAST_APPLIED_RECORD_LAG_SECONDS.labels(label),
            new_active_controllers=CONTROLLER_NEW_ACTIVE_CONTROLLERS.labels(label),
            metadata_errors=CONTROLLER_METADATA_ERRORS.labels(label),
        )


@dataclass(frozen=True, slots=True)
class IntakeMetrics:
    """The intake series of one node (the per-intake-process ones are bound on first use)."""

    node: str
    received_batches: Counter
    received_calls: Counter
    cancelled_calls: Counter

    @classmethod
    def for_node(cls, node: int | str) -> IntakeMetrics:
        label = str(node)
        return cls(
            label,
            INTAKE_RECEIVED_BATCHES.labels(label),
            INTAKE_RECEIVED_CALLS.labels(label),
            INTAKE_CANCELLED_CALLS.labels(label),
        )

    def counter(self, name: str, intake: int) -> Counter:
        """``kraft_intake_<name>_total`` of intake process ``intake`` (a key of ``INTAKE_COUNTERS``)."""
        return INTAKE_COUNTERS[name].labels(self.node, str(intake))


@dataclass(frozen=True, slots=True)
class BrokerMetrics:
    """The broker series of one node."""

    state: Gauge
    last_applied_record_offset: Gauge
    last_applied_record_lag_seconds: Gauge
    metadata_lag_records: Gauge
    metadata_apply_errors: Counter
    offline_log_dirs: Gauge

    @classmethod
    def for_node(cls, node: int | str) -> BrokerMetrics:
        label = str(node)
        return cls(
            state=BROKER_STATE.labels(label),
            last_applied_record_offset=BROKER_LAST_APPLIED_RECORD_OFFSET.labels(label),
            last_applied_record_lag_seconds=BROKER_LAST_APPLIED_RECORD_LAG_SECONDS.labels(label),
            metadata_lag_records=BROKER_METADATA_LAG_RECORDS.labels(label),
            metadata_apply_errors=BROKER_METADATA_APPLY_ERRORS.labels(label),
            offline_log_dirs=BROKER_OFFLINE_LOG_DIRS.labels(label),
        )


class MetricsServer:
    """A running ``/metrics`` HTTP endpoint (a daemon thread); :meth:`close` stops it.

    ``tls_context`` (a function returning the current ``ssl.SSLContext``) makes it HTTPS.  Connections are
    bounded in number, I/O time and lifetime (:mod:`kraft.observability.http_server`)."""

    def __init__(
        self,
        port: int,
        addr: str,
        registry: CollectorRegistry,
        tls_context: Callable[[], ssl.SSLContext] | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self._server, self._thread = serve(
            addr,
            port,
            make_wsgi_app(registry),
            tls_context=tls_context,
            limits=limits,
            name="metrics-https" if tls_context is not None else "metrics-http",
        )
        self.port: int = self._server.server_port
        self.tls = tls_context is not None

    @property
    def open_connections(self) -> int:
        return self._server.open_connections

    @property
    def refused_connections(self) -> int:
        return self._server.refused

    @property
    def timed_out_connections(self) -> int:
        """Connections ended by the I/O timeout (a silent client, a handshake never started)."""
        return self._server.timed_out

    @property
    def deadline_cut_connections(self) -> int:
        """Connections shut down at their deadline (a client trickling bytes)."""
        return self._server.cut_at_deadline

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(
    port: int,
    addr: str = "127.0.0.1",
    registry: CollectorRegistry = REGISTRY,
    tls_context: Callable[[], ssl.SSLContext] | None = None,
    limits: HttpLimits | None = None,
) -> MetricsServer | None:
    """Serve ``/metrics`` on ``addr:port`` (HTTPS with ``tls_context``); ``port == 0`` means metrics are
    off (``metrics.port`` default).  Nodes pass ``metrics.host`` (default: their listener's host); nothing
    listens on every interface unless asked to.

    Raises ``OSError`` when the port cannot be bound, so the caller can report which key to change.
    """
    if port == 0:
        return None
    return MetricsServer(port, addr, registry, tls_context, limits)


def render_metrics(registry: CollectorRegistry = REGISTRY) -> str:
    """The text exposition of every metric (what a scrape returns)."""
    return generate_latest(registry).decode("utf-8")


@dataclass(frozen=True, slots=True)
class ReplicationMetrics:
    """The partition replication series of one broker (Kafka's ReplicaManager/ReplicaFetcherManager)."""

    leader_count: Gauge
    partition_count: Gauge
    under_replicated_partitions: Gauge
    under_min_isr_partition_count: Gauge
    at_min_isr_partition_count: Gauge
    isr_shrinks: Counter
    isr_expands: Counter
    replica_fetcher_max_lag: Gauge
    replica_fetcher_bytes: Counter

    @classmethod
    def for_node(cls, node: int | str) -> ReplicationMetrics:
        label = str(node)
        return cls(
            leader_count=REPLICA_LEADER_COUNT.labels(label),
            partition_count=REPLICA_PARTITION_COUNT.labels(label),
            under_replicated_partitions=REPLICA_UNDER_REPLICATED_PARTITIONS.labels(label),
            under_min_isr_partition_count=REPLICA_UNDER_MIN_ISR_PARTITION_COUNT.labels(label),
            at_min_isr_partition_count=REPLICA_AT_MIN_ISR_PARTITION_COUNT.labels(label),
            isr_shrinks=REPLICA_ISR_SHRINKS.labels(label),
            isr_expands=REPLICA_ISR_EXPANDS.labels(label),
            replica_fetcher_max_lag=REPLICA_FETCHER_MAX_LAG.labels(label),
            replica_fetcher_bytes=REPLICA_FETCHER_BYTES.labels(label),
        )

    @staticmethod
    def forget(node: int | str) -> None:
        """Drop the node's series from every replication family (for a node that is gone for good
        from this process: a test that builds one per example).  A label set stays in the process's
        registry until removed, and every collection (a scrape, ``get_sample_value``) walks all of
        them: after 47 examples of two such nodes each, one ``get_sample_value`` took ~10 ms, not ~1."""
        label = str(node)
        for family in (
            REPLICA_LEADER_COUNT,
            REPLICA_PARTITION_COUNT,
            REPLICA_UNDER_REPLICATED_PARTITIONS,
            REPLICA_UNDER_MIN_ISR_PARTITION_COUNT,
            REPLICA_AT_MIN_ISR_PARTITION_COUNT,
            REPLICA_ISR_SHRINKS,
            REPLICA_ISR_EXPANDS,
            REPLICA_FETCHER_MAX_LAG,
            REPLICA_FETCHER_BYTES,
        ):
            with contextlib.suppress(KeyError):  # never created (or already dropped)
                family.remove(label)


@dataclass(frozen=True, slots=True)
class RequestCounters:
    """The BrokerTopicMetrics counters of one scope (every topic, or one), bound to their children."""

    messages_in: Counter
    bytes_in: Counter
    bytes_out: Counter
    produce_requests: Counter
    fetch_requests: Counter
    failed_produce_requests: Counter
    failed_fetch_requests: Counter


class BrokerRequestMetrics:
    """Produce/Fetch request, record and byte counts of one broker, all topics and per topic, and the
    request latency histograms (Kafka's BrokerTopicMetrics and RequestMetrics).

    One call per request, none per record: the handler passes counts it already has (records in the
    request, bytes on the wire).  Used from the broker's event loop only (the per-topic cache is a dict)."""

    __slots__ = ("_node", "_topics", "all_topics", "fetch_latency", "produce_latency")

    def __init__(self, node: int | str) -> None:
        self._node = str(node)
        self.all_topics = RequestCounters(
            **{n: c.labels(self._node) for n, c in BROKER_REQUEST_TOTALS.items()}
        )
        self.produce_latency: Histogram = BROKER_REQUEST_LATENCY.labels(self._node, "Produce")
        self.fetch_latency: Histogram = BROKER_REQUEST_LATENCY.labels(self._node, "Fetch")
        self._topics: dict[str, RequestCounters] = {}

    def topic(self, topic: str) -> RequestCounters:
        """The counters of ``topic`` (created on first use; the caller checks the topic exists)."""
        counters = self._topics.get(topic)
        if counters is None:
            counters = self._topics[topic] = RequestCounters(
                **{n: c.labels(self._node, topic) for n, c in BROKER_REQUEST_TOPICS.items()}
            )
        return counters

    def produced(self, topic: str | None, records: int, wire_bytes: int, seconds: float) -> None:
        """A Produce that appended ``records`` (``topic`` None: not a topic of the image)."""
        self._count(self.all_topics, records, wire_bytes)
        if topic is not None:
            self._count(self.topic(topic), records, wire_bytes)
        self.produce_latency.observe(seconds)

    def produce_failed(self, topic: str | None, seconds: float) -> None:
        self.all_topics.produce_requests.inc()
        self.all_topics.failed_produce_requests.inc()
        if topic is not None:
            counters = self.topic(topic)
            counters.produce_requests.inc()
            counters.failed_produce_requests.inc()
        self.produce_latency.observe(seconds)

    def fetched(self, topic: str | None, sent_bytes: int, seconds: float) -> None:
        self.all_topics.fetch_requests.inc()
        self.all_topics.bytes_out.inc(sent_bytes)
        if topic is not None:
            counters = self.topic(topic)
            counters.fetch_requests.inc()
            counters.bytes_out.inc(sent_bytes)
        self.fetch_latency.observe(seconds)

    def fetch_failed(self, topic: str | None, seconds: float) -> None:
        self.all_topics.fetch_requests.inc()
        self.all_topics.failed_fetch_requests.inc()
        if topic is not None:
            counters = self.topic(topic)
            counters.fetch_requests.inc()
            counters.failed_fetch_requests.inc()
        self.fetch_latency.observe(seconds)

    def retain_topics(self, exists: Callable[[str], bool]) -> None:
        """Drop the series of topics that no longer exist (called with each new metadata image)."""
        gone = [topic for topic in self._topics if not exists(topic)]
        for topic in gone:
            del self._topics[topic]
            for family in BROKER_REQUEST_TOPICS.values():
                family.remove(self._node, topic)

    @staticmethod
    def _count(counters: RequestCounters, records: int, wire_bytes: int) -> None:
        counters.produce_requests.inc()
        counters.messages_in.inc(records)
        counters.bytes_in.inc(wire_bytes)
