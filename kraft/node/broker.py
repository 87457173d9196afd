"""The broker process: wires status, partition manager, publisher, fetcher, lifecycle and the gRPC server.

:func:`run_broker` is the process entry point (``kraft broker start``): storage check, image store,
:class:`BrokerServer`, signal handlers.

Tasks (one writer per piece of state, as in hashicorp/raft's docs):

- ``heartbeats`` (:class:`~kraft.broker.lifecycle.BrokerLifecycle`) — owns :class:`BrokerStatus`
  fencing/state and the lease; re-registers on STALE_BROKER_EPOCH;
- ``metadata-fetcher`` (:class:`~kraft.broker.fetcher.MetadataFetcher`) — owns the image, the image
  store and the partition manager's directory changes (through the publisher), and
  ``status.metadata_offset``;
- gRPC handlers (:class:`~kraft.broker.service.BrokerService`) — read the status, append to / read from
  partition logs of partitions they lead.

Startup: STARTING → load the image store (verified: a damaged store is discarded, see
:mod:`kraft.metadata.store`) and scan the partition directories without opening any → serve gRPC
(everything answers BROKER_NOT_AVAILABLE until RUNNING) → register (RECOVERY) → heartbeats start →
**catch up**: fetch the controller's committed metadata up to the high watermark it answers after
registration (or its snapshot) → open/create the partitions the caught-up image assigns here and remove
the directories of everything else, paced → the fetcher task → the first heartbeat after catching up to
the broker's own registration record asks to be unfenced → RUNNING.  So a topic deleted while the broker
was down is never re-created from the stale stored image (issue #14).

Fail-stop (issue #14): with a :class:`~kraft.node.supervisor.Supervisor` (``run_broker`` always passes
one), a watched task (heartbeats, fetcher, gRPC server) that raises or ends unexpectedly, or an error of
the catch-up, ends the process with one ``event=fatal`` line and exit status 70 after
:meth:`BrokerServer.abort` (crash-like: partition logs are not closed cleanly).  Failing to start or to
register stays a startup error (one ``error:`` line, exit 1).  A storage error while serving one
partition (corrupt data, a failed write) takes that partition's log dir offline instead
(:meth:`~kraft.broker.partitions.PartitionManager.storage_failed`; heartbeats report it and the controller
moves the leaderships); only when the last log dir goes offline does the process stop
(``reason=all_log_dirs_offline``).
Shutdown (``stop`` event, e.g. SIGTERM): PENDING_CONTROLLED_SHUTDOWN → heartbeat want_shut_down until
the controller answers should_shut_down (bounded by ``controlled_shutdown_timeout_s``) → SHUTTING_DOWN →
stop tasks and server, close logs and store → NOT_RUNNING.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.broker.image_adapter import ImageMetadataView
from kraft.broker.incarnation import accept_incarnation, take_over_incarnation
from kraft.broker.lifecycle import BrokerLifecycle, LifecycleTimings, RegistrationFailed, RegistrationInfo
from kraft.broker.open_files import open_segment_files_capacity
from kraft.broker.partition_log import PartitionLogOpener
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import ImageStore, MetadataPublisher
from kraft.broker.replication import ReplicaManager, ReplicationSettings
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.service import BrokerService, add_broker_service
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState
from kraft.client.channel import PLAINTEXT_SECURITY, ChannelSecurity
from kraft.client.controller import ControllerClient
from kraft.client.heartbeat_stream import HeartbeatStream
from kraft.clock import SystemClock
from kraft.config import (
    DEFAULT_MAX_PARKED_FETCHES,
    DEFAULT_MESSAGE_MAX_BYTES,
    GRPC_ENVELOPE_BYTES,
    NodeConfig,
)
from kraft.errors import ErrorCode, KraftError
from kraft.grpc_service import ServerLimits, create_server, server_limits
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import IMAGE_STORE_FILE, SqliteImageStore
from kraft.node.supervisor import Supervisor
from kraft.observability import gc_watch
from kraft.observability.health import BROKER_SERVICE, HealthReporter, add_health_service
from kraft.observability.logging import get_logger
from kraft.observability.metrics import BrokerMetrics, MetricsServer, start_metrics_server
from kraft.runtime import grpc_io_name, running_loop_name
from kraft.security.acl import StandardAcl
from kraft.security.authorizer import Authorizer, AuthorizerSettings
from kraft.security.guard import RequestGuard
from kraft.security.principal import install_principal_mapper
from kraft.security.tls import (
    CertificateReloader,
    MetricsTlsContext,
    SslSettings,
    TlsError,
    add_port,
    listener_settings,
    outbound_security,
)
from kraft.storage.dir_lock import DirectoryLocks
from kraft.storage.errors import StorageError
from kraft.storage.meta_properties import check_meta_properties
from kraft.storage.open_files import OpenFileCache
from kraft.v1.common_pb2 import Endpoint

_SHUTDOWN_GRACE_S = 1.0

# A combined node (process.roles=broker,controller) runs a controller process on the same metadata dir,
# whose image store already uses IMAGE_STORE_FILE: the broker must not share that file.
COMBINED_IMAGE_STORE_FILE = "broker-metadata-image.sqlite"


class BrokerStartupError(Exception):
    """The broker cannot start; the message is the one line the CLI prints."""


def image_store_path(config: NodeConfig) -> Path:
    """Where the broker keeps its image store (the name `kraft metadata shell --config` looks for)."""
    base = config.metadata_log_dir or config.log_dirs[0]
    return Path(base) / (COMBINED_IMAGE_STORE_FILE if config.is_controller else IMAGE_STORE_FILE)


def cluster_id_of(config: NodeConfig) -> str:
    """The cluster id every log dir was formatted with (they must agree and name this node)."""
    ids = {str(d): check_meta_properties(d, node_id=config.node_id).cluster_id for d in config.all_log_dirs}
    if len(set(ids.values())) != 1:
        listing = ", ".join(f"{d}={c}" for d, c in sorted(ids.items()))
        raise BrokerStartupError(f"log dirs belong to different clusters: {listing}")
    return next(iter(ids.values()))


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Everything the broker reads from its NodeConfig (kept apart so tests can build one directly)."""

    broker_id: int
    cluster_id: str
    voters: tuple[tuple[int, str], ...]
    bind_address: str
    listeners: tuple[Endpoint, ...]
    client_listener: str
    rack: str | None
    log_dirs: tuple[Path, ...]
    heartbeat_interval_ms: int
    session_timeout_ms: int
    registration_timeout_ms: int
    request_timeout_ms: int
    retry_backoff_ms: int
    fetch_max_wait_ms: int
    log_segment_bytes: int
    max_message_bytes: int  # grpc.max.message.bytes
    metrics_port: int
    message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES  # message.max.bytes: largest batch a Produce appends
    server_tls: SslSettings | None = None  # the broker listener's SSL settings (None: PLAINTEXT)
    controller_security: ChannelSecurity = PLAINTEXT_SECURITY  # how the controllers are dialled
    broker_security: ChannelSecurity = PLAINTEXT_SECURITY  # how other brokers are dialled (replica fetch)
    authorizer: AuthorizerSettings = field(default_factory=AuthorizerSettings)  # authorizer.class.name, …
    metrics_host: str = "127.0.0.1"  # metrics.host (default: the listener's host)
    # connections: handshake/idle timeouts, connection cap, keepalive (kraft.grpc_service)
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    max_parked_fetches: int = DEFAULT_MAX_PARKED_FETCHES  # fetch.max.parked.requests
    replication: ReplicationSettings = field(default_factory=ReplicationSettings)  # replica.*, min.insync…
    heartbeat_stream: bool = True  # broker.heartbeat.stream: heartbeats over one stream (else unary calls)
    open_segment_files_max: int = 0
    controller_listener_names: tuple[str, ...] = ()
    """controller.listener.names: which endpoint of a voter the active controller sends is dialled."""
    """log.open.segment.files.max: segment files kept open at once (0 = half the open-file soft limit)."""

    @property
    def controller_call_deadline_s(self) -> float:
        """One registration, heartbeat or AlterPartition call to the controllers, all its attempts
        together (each attempt: ``controller.quorum.request.timeout.ms`` at most): half the session
        timeout, as Kafka's broker-to-controller channel (KAFKA-14392)."""
        return self.session_timeout_ms / 2000.0

    @property
    def controlled_shutdown_timeout_s(self) -> float:
        # Long enough for a few heartbeats while leaderships move, short enough that a dead quorum
        # does not keep SIGTERM waiting forever.
        return max(5.0, 3 * self.session_timeout_ms / 1000.0)

    @classmethod
    def from_config(cls, config: NodeConfig, cluster_id: str) -> BrokerSettings:
        listener = config.broker_listener
        if listener is None:
            raise ValueError("a broker needs a non-controller listener in 'listeners'")
        return cls(
            broker_id=config.node_id,
            cluster_id=cluster_id,
            voters=config.controller_addresses,
            bind_address=listener.bind_address,
            listeners=tuple(
                Endpoint(
                    name=lst.name,
                    host=config.advertised(lst).host or "127.0.0.1",
                    port=config.advertised(lst).port,
                    security_protocol=config.security_protocol(lst.name),
                )
                for lst in config.listeners
                if lst.name not in config.controller_listener_names
            ),
            client_listener=listener.name,
            rack=config.broker_rack,
            log_dirs=tuple(config.log_dirs),
            heartbeat_interval_ms=config.broker_heartbeat_interval_ms,
            heartbeat_stream=config.broker_heartbeat_stream,
            session_timeout_ms=config.broker_session_timeout_ms,
            registration_timeout_ms=config.initial_broker_registration_timeout_ms,
            request_timeout_ms=config.controller_quorum_request_timeout_ms,
            retry_backoff_ms=max(config.controller_quorum_retry_backoff_ms, 20),
            fetch_max_wait_ms=config.controller_quorum_fetch_max_wait_ms,
            log_segment_bytes=config.log_segment_bytes,
            max_message_bytes=config.grpc_max_message_bytes,
            metrics_port=config.metrics_port,
            message_max_bytes=config.message_max_bytes,
            server_tls=listener_settings(config, listener.name),
            controller_security=outbound_security(config, config.controller_listener_names[0]),
            broker_security=outbound_security(config, listener.name),
            authorizer=config.authorizer_settings,
            metrics_host=config.metrics_bind_host,
            server_limits=server_limits(config),
            max_parked_fetches=config.fetch_max_parked_requests,
            replication=ReplicationSettings(
                replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                fetch_max_wait_ms=config.replica_fetch_wait_max_ms,
                fetch_max_bytes=config.replica_fetch_max_bytes,
                # A response must fit in one gRPC message (the first batch may exceed the limits, but a
                # batch is at most message.max.bytes, which fits too).
                fetch_response_max_bytes=min(
                    config.replica_fetch_response_max_bytes,
                    config.grpc_max_message_bytes - GRPC_ENVELOPE_BYTES,
                ),
                fetch_backoff_ms=config.replica_fetch_backoff_ms,
                request_timeout_ms=config.replica_socket_timeout_ms,
                min_insync_replicas=config.min_insync_replicas,
                hwm_checkpoint_interval_ms=config.replica_high_watermark_checkpoint_interval_ms,
            ),
            open_segment_files_max=config.log_open_segment_files_max,
            controller_listener_names=tuple(config.controller_listener_names),
        )


class BrokerServer:
    def __init__(
        self,
        settings: BrokerSettings,
        store: ImageStore,
        open_log: PartitionLogOpener | None = None,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.settings = settings
        self.supervisor = supervisor
        s = settings
        self.status = BrokerStatus(s.broker_id, s.cluster_id, s.session_timeout_ms, clock=SystemClock())
        self.status.incarnation_id = str(uuid.uuid4())
        # The log dir holding this process's incarnation file (kraft.broker.incarnation), set by
        # run_broker after taking it over under the directory locks; None: no file (tests).
        self.incarnation_dir: Path | None = None
        self.metrics = BrokerMetrics.for_node(s.broker_id)
        self.open_files = OpenFileCache(open_segment_files_capacity(s.open_segment_files_max))
        self.partitions = PartitionManager(
            s.broker_id,
            s.log_dirs,
            open_log or segmented_log_opener(s.log_segment_bytes, open_files=self.open_files),
        )
        partitions = self.partitions
        self.metrics.offline_log_dirs.set_function(lambda: len(partitions.offline_dirs))
        self.client = ControllerClient(
            s.voters,
            max_message_bytes=s.max_message_bytes,
            security=s.controller_security,
            log=get_logger("broker", node=s.broker_id),
            request_timeout_s=s.request_timeout_ms / 1000.0,
            listener_names=s.controller_listener_names,
        )
        self.replicas = ReplicaManager(
            s.broker_id,
            s.cluster_id,
            self.partitions,
            clock=SystemClock(),
            broker_epoch=lambda: self.status.broker_epoch,
            lease=self.status,
            send_alter_partition=lambda request: self.client.alter_partition(
                request, s.controller_call_deadline_s
            ),
            listener=s.client_listener,
            security=s.broker_security,
            channel_options=[
                ("grpc.max_send_message_length", s.max_message_bytes),
                ("grpc.max_receive_message_length", s.max_message_bytes),
            ],
            settings=s.replication,
            on_fatal=None if supervisor is None else supervisor.fail,
        )
        # ACLs come from the image this broker applied last (set by _on_view).
        self._acls: Mapping[str, StandardAcl] = {}
        authorizer = Authorizer(s.authorizer, lambda: self._acls) if s.authorizer.enabled else None
        self.service = BrokerService(
            self.status,
            self.partitions,
            ImageMetadataView(MetadataImage.empty(), s.client_listener),
            message_max_bytes=s.message_max_bytes,
            grpc_max_message_bytes=s.max_message_bytes,
            replicas=self.replicas,
            guard=RequestGuard(authorizer),
            max_parked=s.max_parked_fetches,
        )
        self.publisher = MetadataPublisher(
            s.broker_id,
            self.partitions,
            store,
            s.client_listener,
            self._on_view,
            self.metrics,
            clock=SystemClock(),
        )
        self._store = store
        # broker.heartbeat.stream: one BrokerHeartbeatStream to the active controller (closed on stop)
        self.heartbeat_stream = HeartbeatStream(self.client) if s.heartbeat_stream else None
        self.lifecycle = BrokerLifecycle(
            self.status,
            self.client,
            RegistrationInfo(s.listeners, s.rack, tuple(str(d) for d in s.log_dirs)),
            LifecycleTimings(
                heartbeat_interval_s=s.heartbeat_interval_ms / 1000.0,
                request_timeout_s=s.request_timeout_ms / 1000.0,
                registration_timeout_s=s.registration_timeout_ms / 1000.0,
                retry_backoff_s=s.retry_backoff_ms / 1000.0,
                call_deadline_s=s.controller_call_deadline_s,
            ),
            caught_up=self._caught_up,
            on_fenced=self._on_fenced,
            offline=self.partitions.offline_report,
            heartbeats=self.heartbeat_stream.heartbeat if self.heartbeat_stream is not None else None,
        )
        if supervisor is not None:
            # A storage error while serving took the last log dir offline: nothing can be hosted.
            self.partitions.on_all_offline = lambda error: supervisor.fail("all_log_dirs_offline", error)
        self.fetcher = MetadataFetcher(
            s.broker_id,
            s.cluster_id,
            self.client,
            self.publisher,
            FetcherTimings(
                max_wait_ms=s.fetch_max_wait_ms,
                request_timeout_s=s.request_timeout_ms / 1000.0,
                retry_backoff_s=s.retry_backoff_ms / 1000.0,
            ),
            on_applied=self._on_applied,
            on_drained=self._on_drained,
            generation=lambda: self.status.resync_generation,
            metrics=self.metrics,
            clock=SystemClock(),
            voters=self.client,  # the controllers' voter set becomes the client's rotation (KIP-853)
        )
        # Set when the controller fenced a running broker: it may ask to be unfenced again only after its
        # image shows that fence, because the leader moves that come with it precede it in the log.
        self._await_fence_in_image = False
        self._image_showed_unfenced = False
        # Between the start-up open and the end of the replica states' stepped build: not ready (as in
        # Kafka, a broker is unfenced once its partitions' leader/follower states are set up).
        self._building_states = False
        self._health: HealthReporter | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_server: MetricsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = -1
        self.certificates: CertificateReloader | None = None
        self._log = get_logger("broker", node=s.broker_id).with_context(
            lambda: {"state": self.status.state.name, "epoch": self.status.broker_epoch}
        )
        self.status.on_transition(self._on_transition)

    # --- the process ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (then shut down in a controlled way) or a fatal error is raised."""
        self.status.transition(BrokerState.STARTING)
        self._tasks = tasks = []
        try:
            tls = self.settings.server_tls
            self._metrics_server = start_metrics_server(
                self.settings.metrics_port,
                self.settings.metrics_host,
                tls_context=MetricsTlsContext(tls) if tls else None,
            )
            await self.publisher.start()
            self.status.metadata_offset = self.publisher.offset
            await self._start_server()
            registered = await self._until_stopped(self.lifecycle.register(), stop, "registration")
            if not registered:
                return
            await self._accept_incarnation()
            heartbeats = asyncio.create_task(self.lifecycle.run_heartbeats(), name="heartbeats")
            tasks.append(heartbeats)
            # Heartbeats end by themselves only when the controller granted a shutdown: not a failure.
            self._watch(heartbeats, forever=False)
            if not await self._until_stopped(self._catch_up_then_open(), stop, "metadata catch-up"):
                await self._controlled_shutdown()
                return
            fetcher = asyncio.create_task(self.fetcher.run(), name="metadata-fetcher")
            tasks.append(fetcher)
            self._watch(fetcher)
            replicas = asyncio.create_task(self.replicas.run(), name="isr-shrink-check")
            tasks.append(replicas)
            self._watch(replicas)
            stop_wait = asyncio.create_task(stop.wait(), name="stop-wait")
            done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            for task in done:
                error = None if task is stop_wait else task.exception()
                if error is not None:
                    raise error
            await self._controlled_shutdown()
        finally:
            if self.supervisor is None or self.supervisor.failure is None:
                await self._shut_down(tasks)
            # else: fail-stop — run_broker aborts the process; no graceful step on failed storage.

    def _watch(self, task: asyncio.Task[None], *, forever: bool = True) -> None:
        if self.supervisor is not None:
            self.supervisor.watch(task, task.get_name(), forever=forever)

    async def _catch_up_then_open(self) -> bool:
        """Fetch committed metadata up to the controller's high watermark (as answered after this broker
        registered), then open the partitions of the caught-up image — never from the stored image alone."""
        fetcher, publisher = self.fetcher, self.publisher
        fetcher.resume_from_publisher()
        started_ms = self.status.monotonic_ms()
        from_offset = publisher.offset
        target = -1
        attempt = 0
        while True:
            if await fetcher.fetch_once():
                attempt = 0
                if target < 0 and fetcher.high_watermark >= 0:
                    target = fetcher.high_watermark
                    self._log.info("metadata_catch_up", from_offset=from_offset, high_watermark=target)
                    if publisher.offset >= target:
                        # The stored image claims records the controller never committed (an edited or
                        # foreign store): a cache, never a source of truth — rebuild from the controller.
                        await publisher.discard_image(
                            f"ahead of the controller: image offset {publisher.offset} >= "
                            f"high watermark {target}"
                        )
                        self.status.metadata_offset = publisher.offset
                        fetcher.resume_from_publisher()
                        continue
                # Caught up once everything below the target is applied and no transaction is pending.
                if (
                    target >= 0
                    and publisher.offset + 1 >= target
                    and fetcher.fetch_offset == publisher.offset + 1
                ):
                    break
                continue
            base = self.settings.retry_backoff_ms / 1000.0 * (2.0 ** min(attempt, 5))
            await asyncio.sleep(min(base, 1.0))
            attempt += 1
        self._building_states = True
        try:
            applied = await publisher.open_partitions()
            await self.replicas.wait_built()  # (the new states, built in loop turns: issue #17)
        finally:
            self._building_states = False
        self._log.info(
            "metadata_caught_up",
            metadata_offset=publisher.offset,
            partitions=len(self.partitions),
            created=len(applied.created),
            took_ms=self.status.monotonic_ms() - started_ms,
        )
        self.lifecycle.wake()
        return True

    async def _accept_incarnation(self) -> None:
        """The controller accepted this incarnation: the file forgets its predecessors
        (kraft.broker.incarnation).  An fsync'd small write, off the event loop."""
        directory = self.incarnation_dir
        if directory is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, accept_incarnation, directory, self.status.incarnation_id
            )
        except (OSError, StorageError) as exc:
            # The file still holds this id first and a true chain after it: the next process sends a
            # longer list than needed, nothing worse.
            self._log.warning("incarnation_file_not_rewritten", error=str(exc))

    async def _until_stopped(self, work: Coroutine[Any, Any, Any], stop: asyncio.Event, what: str) -> bool:
        """Await ``work`` unless ``stop`` comes first; True when it completed (its error is raised)."""
        work_task = asyncio.create_task(work)
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait([work_task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if not work_task.done():
            work_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RegistrationFailed):
                await work_task
            self._log.info("stopped_before_end_of", step=what)
            return False
        work_task.result()  # raises RegistrationFailed, or a catch-up failure
        return True

    async def abort(self) -> None:
        """After a fatal error: stop serving and release the port like a crash — partition logs and the
        image store are not closed cleanly (no clean-shutdown marker over storage that may have failed)."""
        self.status.revoke_lease()
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            await self._server.stop(0)
        if self.heartbeat_stream is not None:
            self.heartbeat_stream.close()
        await self.client.close()

    async def _controlled_shutdown(self) -> None:
        if self.supervisor is not None:
            self.supervisor.begin_stop()
        self.lifecycle.request_shutdown()
        self._log.info("controlled_shutdown_started")
        try:
            await asyncio.wait_for(
                self.lifecycle.shutdown_granted.wait(), self.settings.controlled_shutdown_timeout_s
            )
        except TimeoutError:
            self._log.warning(
                "controlled_shutdown_timed_out", timeout_s=self.settings.controlled_shutdown_timeout_s
            )

    async def _shut_down(self, tasks: list[asyncio.Task[None]]) -> None:
        if self.supervisor is not None:
            self.supervisor.begin_stop()
        if self.status.state is not BrokerState.NOT_RUNNING:
            self.status.transition(BrokerState.SHUTTING_DOWN)
        self.status.revoke_lease()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._health is not None:
            await self._health.shutdown()
        if self._server is not None:
            await self._server.stop(_SHUTDOWN_GRACE_S)
        with contextlib.suppress(Exception):  # a failed save is already logged; the store stays consistent
            await self.publisher.flush()
        await self.replicas.close()
        self.partitions.close()
        await self._store.close()
        if self.heartbeat_stream is not None:
            self.heartbeat_stream.close()
        await self.client.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        self.status.transition(BrokerState.NOT_RUNNING)

    async def _start_server(self) -> None:
        limits = replace(self.settings.server_limits, max_message_bytes=self.settings.max_message_bytes)
        server = create_server(limits)
        add_broker_service(server, self.service)
        self._health = await add_health_service(server, (BROKER_SERVICE,))
        if self.settings.server_tls is not None:
            install_principal_mapper(self.settings.server_tls.mapper())
        try:
            self.port, self.certificates = add_port(
                server, self.settings.bind_address, self.settings.server_tls, self.settings.client_listener
            )
        except TlsError as err:
            raise KraftError(ErrorCode.INVALID_CONFIG, f"cannot use the TLS configuration: {err}") from None
        except RuntimeError as err:  # grpc reports a failed bind this way
            raise KraftError(
                ErrorCode.INVALID_CONFIG, f"listeners: cannot listen on {self.settings.bind_address} ({err})"
            ) from err
        await server.start()
        self._server = server
        if self.supervisor is not None:
            # Not cancelled at shutdown: cancelling wait_for_termination cancels grpc's own shutdown.
            self.supervisor.watch(
                asyncio.create_task(server.wait_for_termination(), name="grpc-server"), "grpc-server"
            )
        self._log.info(
            "listening",
            address=self.settings.bind_address,
            port=self.port,
            event_loop=running_loop_name(),
            grpc_io=grpc_io_name(),
            open_segment_files_max=self.open_files.capacity,
        )

    # --- callbacks ----------------------------------------------------------------------------------

    def _on_view(self, view: ImageMetadataView) -> None:
        """A newly applied image: the service answers from it, replication follows its roles."""
        self._acls = view.image.acls
        self.service.set_view(view)
        self.replicas.on_image(view.image)

    def _caught_up(self) -> bool:
        """Ready to be unfenced: the image includes this broker's registration record and, after a fence
        by the controller, the fence itself (so every leadership it lost is already applied)."""
        status = self.status
        if status.broker_epoch < 0 or status.metadata_offset < status.broker_epoch or status.resync_required:
            return False
        if self.publisher.deferred or self._building_states:
            return False  # partitions not opened yet, or their replica states not built yet
        if self._await_fence_in_image:
            registration = self.publisher.image.brokers.get(status.broker_id)
            if registration is None or registration.epoch != status.broker_epoch or not registration.fenced:
                return False
            self._await_fence_in_image = False
        return True

    def _on_drained(self, generation: int) -> None:
        if self.status.end_resync(generation):
            self._log.info("metadata_resynced", metadata_offset=self.status.metadata_offset)
            self.lifecycle.wake()

    def _on_fenced(self) -> None:
        self._await_fence_in_image = True

    def _on_applied(self, offset: int) -> None:
        status = self.status
        was_caught_up = self._caught_up()
        status.metadata_offset = offset
        registration = self.publisher.image.brokers.get(status.broker_id)
        ours = registration is not None and registration.epoch == status.broker_epoch
        fenced_in_image = ours and registration is not None and registration.fenced
        if self._image_showed_unfenced and fenced_in_image and not status.fenced:
            # The log says we were fenced before any heartbeat told us: stop serving now.
            self.lifecycle.fence_locally(
                "fenced_in_metadata",
                reason="the metadata log shows this broker fenced before any heartbeat answer did "
                "(the controller expired its session)",
            )
        self._image_showed_unfenced = ours and not fenced_in_image
        if not was_caught_up and self._caught_up():
            self._log.info("caught_up", metadata_offset=offset)
            self.lifecycle.wake()

    def _on_transition(self, old: BrokerState, new: BrokerState) -> None:
        self._log.info("broker_state_changed", old=old.name, new=new.name)
        self.metrics.state.set(int(new))
        if self._health is not None:
            health = self._health
            serving = new is BrokerState.RUNNING
            task = asyncio.get_running_loop().create_task(health.set_serving(BROKER_SERVICE, serving))
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


def _is_startup_error(error: BaseException) -> bool:
    """Errors that mean "cannot start" (exit 1 with one ``error:`` line), not a run-time failure."""
    if isinstance(error, RegistrationFailed | BrokerStartupError):
        return True
    return isinstance(error, KraftError) and error.code is ErrorCode.INVALID_CONFIG


async def run_broker(config: NodeConfig, cluster_id: str) -> None:
    """Run a broker until SIGTERM/SIGINT, then shut down in a controlled way.

    Raises RegistrationFailed when it cannot register in time.  A fatal error at run time does not
    return: one ``fatal`` line, exit status 70 (:mod:`kraft.node.supervisor`)."""
    supervisor = Supervisor(get_logger("broker", node=config.node_id))
    gc_watch.install()  # this process's GC pauses: kraft_gc_pause_seconds, a slow event's gc_ms
    gc_watch.tune_node_gc()  # the collector's thresholds for a node's heap ($KRAFT_GC_THRESHOLD for A/B runs)
    # Before anything is opened: a second broker with this node's config must not recover (and so
    # truncate) the running broker's partition logs or touch its image store.
    try:
        locks = DirectoryLocks.acquire(config.all_log_dirs, "broker")
    except KraftError as exc:
        raise BrokerStartupError(exc.message) from None
    with locks:
        await _run_broker_locked(config, cluster_id, supervisor)


async def _run_broker_locked(config: NodeConfig, cluster_id: str, supervisor: Supervisor) -> None:
    store_path = image_store_path(config)
    store = await SqliteImageStore.open(store_path, clock=SystemClock())
    server = BrokerServer(BrokerSettings.from_config(config, cluster_id), store, supervisor=supervisor)
    # Under the directory locks: the processes that stored these ids are gone (kraft.broker.incarnation).
    predecessors = take_over_incarnation(store_path.parent, server.status.incarnation_id)
    server.status.previous_incarnation_id = predecessors[0] if predecessors else ""
    server.status.earlier_incarnation_ids = predecessors[1:]
    server.incarnation_dir = store_path.parent
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    main = asyncio.create_task(server.run(stop), name="broker")
    failure = await supervisor.wait(asyncio.shield(main))
    if failure is None and main.done() and not main.cancelled():
        error = main.exception()
        if error is not None and not _is_startup_error(error):
            supervisor.fail("broker_failed", error)
    if supervisor.failure is not None:
        await supervisor.fail_stop(server.abort)
    await main
