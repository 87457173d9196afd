"""One controller node assembled: config → meta.properties check → storage → Raft driver → grpc.aio server.

:class:`ControllerNode` owns, in start order:

1. the storage check (every log dir formatted, one cluster id, our node id) — :class:`StartupError`
   with one clear line otherwise;
2. the :class:`~kraft.raft.grpc_transport.GrpcTransport` to the other voters;
3. the Raft driver over the segmented log, quorum-state and snapshot files in ``metadata.log.dir``;
4. one grpc.aio server on the CONTROLLER listener with ``RaftService``, grpc.health.v1, the test-only
   ``RaftTestService`` when ``kraft.test.append.enable=true``, and every service added through
   :meth:`ControllerNode.add_service` (how :mod:`kraft.node.metadata_layer` installs
   ``ControllerService``);
5. the Prometheus endpoint when ``metrics.port`` is set.

Asyncio tasks: the driver owns its own tasks; gRPC runs each inbound call in its own task; this module
adds one leadership watcher (health status of ``kraft.v1.RaftService``).  :meth:`ControllerNode.stop`
(SIGTERM) marks health NOT_SERVING, runs stop hooks, lets the driver resign (EndQuorumEpoch) while the
server still answers, then stops the server, closes the transport and the storage (clean-shutdown marker).

Fail-stop (issue #14): with a :class:`~kraft.node.supervisor.Supervisor` (``run_controller`` always passes
one), a Raft driver failure (write/fsync error, ENOSPC, impossible state), committed data the metadata
layer cannot load or apply, an exception in any watched task (leadership watcher, gRPC server, the
controller's own tasks), an image store or snapshot that cannot be written, a start hook that fails after
Raft started, ends the process: one ``event=fatal reason=…`` line, :meth:`ControllerNode.abort`
(crash-like: the log is not closed, so no clean-shutdown marker is written over storage that failed),
exit status 70.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from kraft.client.channel import open_channel
from kraft.clock import SystemClock
from kraft.config import NodeConfig, _join_host_port
from kraft.errors import KraftError
from kraft.grpc_service import create_server, server_limits
from kraft.netutil import advertised_host
from kraft.node.grpc_poller import LoopReaders
from kraft.node.intake import STOP_TIMEOUT_S as INTAKE_STOP_TIMEOUT_S
from kraft.node.intake import AppendBridge, DriverBridge, HopInterceptor, IntakeLoop, name_grpc_poller
from kraft.node.intake_pool import (
    IntakeConfigError,
    IntakeProcesses,
    check_port_free,
    check_supported,
    prepare_socket_dir,
    secure_socket,
    socket_path,
    write_tls_config,
)
from kraft.node.metadata_layer import install_metadata_layer
from kraft.node.supervisor import Supervisor, attach_driver
from kraft.node.voter_endpoint import VoterEndpointUpdater
from kraft.observability import gc_watch
from kraft.observability.health import RAFT_SERVICE, HealthReporter
from kraft.observability.logging import get_logger
from kraft.observability.metrics import MetricsServer, start_metrics_server
from kraft.observability.stall_sampler import StallSamplers
from kraft.raft.api import LeaderAndEpoch, RaftClient
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.grpc_server import FETCH_METHODS, RaftServicer, add_raft_service
from kraft.raft.grpc_test_service import (
    APPEND_METHODS,
    DigestStateMachine,
    RaftTestServicer,
    add_raft_test_service,
)
from kraft.raft.grpc_transport import GrpcTransport
from kraft.raft.state import ImpossibleElectionStateError
from kraft.raft.storage_adapters import FileElectionStore, FileSnapshotStore, SegmentedLogStore
from kraft.raft.voters import Endpoint, VoterSet
from kraft.runtime import grpc_io_name, running_loop_name
from kraft.security.principal import (
    install_principal_mapper,
    stop_trusting_intake_forwarding,
    trust_intake_forwarding,
)
from kraft.security.tls import (
    CertificateReloader,
    MetricsTlsContext,
    SslSettings,
    TlsError,
    add_port,
    check_node_tls,
    listener_settings,
    outbound_security,
)
from kraft.storage.dir_lock import DirectoryLocks
from kraft.storage.log import METADATA_LOG_DIR_NAME, METADATA_LOG_PREALLOCATE_BYTES, LogConfig
from kraft.storage.meta_properties import MetaProperties, read_meta_properties
from kraft.v1 import raft_pb2, raft_pb2_grpc

T = TypeVar("T")

ServiceInstaller = Callable[[grpc.aio.Server], None]
"""Adds one servicer to the node's server, e.g. ``lambda s: add_XServicer_to_server(servicer, s)``."""
IntakeHandlerFactory = Callable[[asyncio.AbstractEventLoop], "grpc.RpcMethodHandler[Any, Any]"]
"""Builds, from the node's main loop, a handler served on the intake loop (``add_intake_handler``)."""

NodeHook = Callable[["ControllerNode"], Awaitable[None]]
"""Runs after the node started (``on_start``) or before it stops (``on_stop``)."""

SHUTDOWN_TIMEOUT_MS = 5000
# Upper bound for each metadata-layer stop hook before the node abandons it and resigns anyway.
STOP_HOOK_TIMEOUT_S = 5.0
STOP_INTAKE_TIMEOUT_S = 5.0
"""How long intake processes get to finish their calls after SIGTERM on a graceful stop."""
# Room for the protobuf envelope around a Fetch response's record bytes.
_FETCH_ENVELOPE_BYTES = 64 * 1024


class StartupError(Exception):
    """The node cannot start; the message is the one line the CLI prints."""


def check_storage(config: NodeConfig) -> MetaProperties:
    """Every log dir is formatted, for one cluster and for this node; returns the metadata dir's props."""
    if config.metadata_log_dir is None:
        raise StartupError("a controller needs metadata.log.dir (or log.dirs)")
    found: dict[Path, MetaProperties] = {}
    for directory in config.all_log_dirs:
        try:
            found[directory] = read_meta_properties(directory)
        except KraftError as exc:
            raise StartupError(exc.message) from None
    cluster_ids = {props.cluster_id for props in found.values()}
    if len(cluster_ids) > 1:
        listed = ", ".join(f"{d} → {p.cluster_id}" for d, p in found.items())
        raise StartupError(f"log directories disagree on cluster.id ({listed}); refusing to start")
    for directory, props in found.items():
        if props.node_id != config.node_id:
            raise StartupError(
                f"log directory {directory} is formatted for node {props.node_id}, "
                f"but node.id={config.node_id}"
            )
    return found[config.metadata_log_dir]


def peer_addresses(config: NodeConfig) -> tuple[tuple[int, str], ...]:
    """(node id, ``host:port``) of the other controllers to dial first: the static voters but this node,
    or the bootstrap servers under pseudo ids but this node's own address (one bootstrap list for every
    node, as Kafka's docs suggest, names each node too; dialing itself would only be refused)."""
    listener = config.controller_listener
    own = (
        {f"{lst.host}:{lst.port}" for lst in (listener, config.advertised(listener))}
        if listener is not None
        else set()
    )
    return tuple(
        (node_id, target)
        for node_id, target in config.controller_addresses
        if node_id != config.node_id and target not in own
    )


def raft_config(config: NodeConfig, cluster_id: str, directory_id: str = "") -> RaftConfig:
    """The core's settings from the node's ``controller.quorum.*`` keys and its ``directory.id``."""
    return RaftConfig(
        node_id=config.node_id,
        directory_id=directory_id,
        voters=tuple(voter.id for voter in config.voters),
        bootstrap_ids=tuple(node_id for node_id, _ in peer_addresses(config) if node_id < -1),
        cluster_id=cluster_id,
        election_timeout_ms=config.controller_quorum_election_timeout_ms,
        fetch_timeout_ms=config.controller_quorum_fetch_timeout_ms,
        election_backoff_max_ms=config.controller_quorum_election_backoff_max_ms,
        append_linger_ms=config.controller_quorum_append_linger_ms,
        request_timeout_ms=config.controller_quorum_request_timeout_ms,
        retry_backoff_ms=config.controller_quorum_retry_backoff_ms,
        fetch_max_wait_ms=config.controller_quorum_fetch_max_wait_ms,
        fetch_high_watermark_wait_ms=config.controller_quorum_fetch_high_watermark_wait_ms,
        leader_lease_ms=None if config.controller_quorum_leader_lease_enable else 0,
        # A Fetch response must fit in one gRPC message.
        fetch_max_bytes=max(
            1024, min(8 * 1024 * 1024, config.grpc_max_message_bytes - _FETCH_ENVELOPE_BYTES)
        ),
    )


def open_raft(config: NodeConfig, meta: MetaProperties, transport: GrpcTransport) -> RaftDriver:
    """The Raft driver over ``<metadata.log.dir>/__cluster_metadata-0`` (log, quorum-state, snapshots)."""
    assert config.metadata_log_dir is not None
    directory = config.metadata_log_dir / METADATA_LOG_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    log_config = LogConfig(
        segment_bytes=max(config.metadata_log_segment_bytes, 1024),
        segment_ms=config.metadata_log_segment_ms,
        preallocate_bytes=METADATA_LOG_PREALLOCATE_BYTES,
    )
    log = SegmentedLogStore.open(directory, log_config)
    try:
        return RaftDriver(
            raft_config(config, meta.cluster_id, meta.directory_id),
            transport=transport,
            log=log,
            elections=FileElectionStore(directory),
            snapshots=FileSnapshotStore(directory),
            clock=SystemClock(),
            follower_listener_delay_ms=config.controller_quorum_follower_listener_delay_ms,
        )
    except BaseException:
        log.close()
        raise


class ControllerNode:
    """A running controller; see the module docstring for what it owns and in which order."""

    def __init__(self, config: NodeConfig, supervisor: Supervisor | None = None) -> None:
        if not config.is_controller or config.controller_listener is None:
            raise StartupError("process.roles must include controller and a CONTROLLER listener must be set")
        self.config = config
        self._log = get_logger("controller", node=config.node_id)
        self._installers: list[ServiceInstaller] = []
        self._intake_handlers: dict[str, IntakeHandlerFactory] = {}
        self._start_hooks: list[NodeHook] = []
        self._stop_hooks: list[NodeHook] = []
        self._stop_requested = asyncio.Event()
        self._meta: MetaProperties | None = None
        self._locks: DirectoryLocks | None = None
        self._transport: GrpcTransport | None = None
        self._raft: RaftDriver | None = None
        self._server: grpc.aio.Server | None = None
        self._intake: IntakeLoop | None = None
        """The request plane's thread and loop (controller.request.intake.thread), which owns the server."""
        self._poller_readers: LoopReaders | None = None
        """With the intake loop: the two loops' gRPC wake-up readers — the main loop's off while leading, the
        intake loop's while not (grpc_poller)."""
        self._intake_processes: IntakeProcesses | None = None
        """The intake processes on this node's port (controller.intake.processes > 0)."""
        self._intake_watch: asyncio.Task[None] | None = None
        self._health: HealthReporter | None = None
        self._metrics: MetricsServer | None = None
        self._stall_samplers: StallSamplers | None = None  # observability.stall.sampler.ms > 0
        self._watcher: asyncio.Task[None] | None = None
        self._endpoint_updater: asyncio.Task[None] | None = None
        self._server_watch: asyncio.Task[Any] | None = None
        self._bound_port = 0
        self._tls: SslSettings | None = None
        self.certificates: CertificateReloader | None = None
        """The SSL listener's certificate reloader (None on PLAINTEXT)."""
        self.supervisor = supervisor
        self.test_state: DigestStateMachine | None = None

    # --- extension points (call before start) ---

    def add_service(self, installer: ServiceInstaller) -> None:
        """Install another gRPC service on this node's server (e.g. ControllerService)."""
        if self._server is not None:
            raise RuntimeError("add_service must be called before start()")
        self._installers.append(installer)

    def add_intake_handler(self, method: str, factory: IntakeHandlerFactory) -> None:
        """Serve ``method`` (``/kraft.v1.ControllerService/BrokerHeartbeat``) on the intake thread's loop with
        the handler ``factory(main_loop)`` builds, instead of hopping to the main loop with the installed
        service's (``HopInterceptor(replace=...)``).  Without the intake thread it is not used."""
        if self._server is not None:
            raise RuntimeError("add_intake_handler must be called before start()")
        self._intake_handlers[method] = factory

    def on_start(self, hook: NodeHook) -> None:
        """Run ``hook(node)`` once the server and Raft run (``node.raft`` is available then)."""
        self._start_hooks.append(hook)

    def on_stop(self, hook: NodeHook) -> None:
        """Run ``hook(node)`` first thing on stop, before Raft resigns."""
        self._stop_hooks.append(hook)

    # --- what hooks and tests use ---

    def watch(self, task: asyncio.Task[Any], name: str) -> None:
        """Have the supervisor (if any) fail the process when ``task`` raises or ends before a stop."""
        if self.supervisor is not None:
            self.supervisor.watch(task, name)

    @property
    def raft(self) -> RaftClient:
        if self._raft is None:
            raise RuntimeError("the controller node is not started")
        return self._raft

    @property
    def cluster_id(self) -> str:
        if self._meta is None:
            raise RuntimeError("the controller node is not started")
        return self._meta.cluster_id

    @property
    def directory_id(self) -> str:
        if self._meta is None:
            raise RuntimeError("the controller node is not started")
        return self._meta.directory_id

    @property
    def health(self) -> HealthReporter:
        if self._health is None:
            raise RuntimeError("the controller node is not started")
        return self._health

    @property
    def log_end_offset(self) -> int:
        """The end offset of the local metadata log (after a snapshot reset: the snapshot's end)."""
        if self._raft is None:
            raise RuntimeError("the controller node is not started")
        return self._raft.log_end_offset

    @property
    def port(self) -> int:
        """The port the server bound (useful when the listener says port 0)."""
        return self._bound_port

    def endpoints(self) -> dict[int, tuple[str, int]]:
        """Voter id → (host, port), as advertised in DescribeQuorum / redirects."""
        return {voter.id: (voter.host, voter.port) for voter in self.config.voters}

    def voter_endpoint(self, node_id: int) -> tuple[str, int] | None:
        """(host, port) of a voter of the set in force (its CONTROLLER endpoint); None if unknown.  A
        dynamic quorum's endpoints live in the log (VotersRecord), not the config: redirects name them."""
        raft = self._raft
        voter = raft.voter_set.get(node_id) if raft is not None and node_id >= 0 else None
        if voter is None or not voter.endpoints:
            return None
        names = self.config.controller_listener_names
        endpoint = next((e for e in voter.endpoints if e.name in names), voter.endpoints[0])
        return (endpoint.host, endpoint.port)

    def voters_in_force(self) -> tuple[int, VoterSet] | None:
        """The voter set in force and the offset of the VotersRecord that introduced it (-1: the snapshot's
        or the bootstrap checkpoint's), which MetadataFetch answers carry to brokers; None on a static
        quorum (kraft.version 0: every broker knows the voters from controller.quorum.voters)."""
        raft = self._raft
        if raft is None or raft.kraft_version == 0:
            return None
        return raft.voter_set_offset, raft.voter_set

    def _voter_address(self, node_id: int) -> str | None:
        """``host:port`` of a voter of the set in force (its CONTROLLER endpoint); None if unknown."""
        endpoint = self.voter_endpoint(node_id)
        if endpoint is None:
            return None
        host, port = endpoint
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    # --- lifecycle ---

    async def start(self) -> None:
        cfg = self.config
        self._meta = check_storage(cfg)
        # Before anything is opened: a second process with this node's config must not recover (and so
        # truncate) the running node's log.
        try:
            self._locks = DirectoryLocks.acquire(cfg.all_log_dirs, "controller")
        except KraftError as exc:
            raise StartupError(exc.message) from None
        try:
            self._tls = check_node_tls(cfg)
        except TlsError as exc:
            self._release_locks()
            raise StartupError(f"cannot use the TLS configuration: {exc}") from None
        if self._tls is not None:
            install_principal_mapper(self._tls.mapper())
        # Static voters, or (a dynamic quorum) the bootstrap servers under pseudo ids; the voter set in
        # force is asked first (_voter_address).
        peers = dict(peer_addresses(cfg))
        self._transport = GrpcTransport(
            peers,
            resolve=self._voter_address,
            cluster_id=self._meta.cluster_id,
            retry_backoff_ms=cfg.controller_quorum_retry_backoff_ms,
            max_backoff_ms=max(cfg.controller_quorum_election_backoff_max_ms, 100),
            max_message_bytes=cfg.grpc_max_message_bytes,
            security=outbound_security(cfg, cfg.controller_listener_names[0]),
            log=self._log,
        )
        try:
            try:
                self._raft = open_raft(cfg, self._meta, self._transport)
            except KraftError as exc:
                raise StartupError(f"cannot open the metadata log: {exc.message}") from None
            except ImpossibleElectionStateError as exc:  # a forged or corrupt quorum-state (issue #15)
                raise StartupError(f"cannot open the metadata log: {exc}") from None
            if self.supervisor is not None:
                attach_driver(self.supervisor, self._raft.on_fatal)
            await self._start_server()
            await self._raft.start()
        except BaseException:
            await self._close_resources()
            raise
        self._watcher = asyncio.create_task(self._watch_leadership(), name="controller-health-watcher")
        self.watch(self._watcher, "controller-health-watcher")
        if not cfg.controller_quorum_voters:  # a dynamic quorum: endpoints live in the log
            self._endpoint_updater = asyncio.create_task(
                self._voter_endpoint_updater().run(), name="voter-endpoint-updater"
            )
            self.watch(self._endpoint_updater, "voter-endpoint-updater")
        if self._server is not None:
            server = self._server
            self._server_watch = asyncio.create_task(
                self._on_server_loop(server.wait_for_termination()), name="grpc-server"
            )
            self.watch(self._server_watch, "grpc-server")
        if self._intake_processes is not None:
            self._intake_watch = asyncio.create_task(
                self._intake_processes.watch(self._intake_process_died), name="intake-processes"
            )
            self.watch(self._intake_watch, "intake-processes")
        if cfg.metrics_port:
            try:
                listener = cfg.controller_listener.name if cfg.controller_listener else ""
                https = listener_settings(cfg, listener)
                self._metrics = start_metrics_server(
                    cfg.metrics_port,
                    cfg.metrics_bind_host,
                    tls_context=MetricsTlsContext(https) if https else None,
                )
            except OSError as exc:
                self._log.warning("metrics_server_failed", port=cfg.metrics_port, error=str(exc))
        for hook in self._start_hooks:
            await hook(self)
        self._log.info(
            "controller_started",
            cluster_id=self._meta.cluster_id,
            listener=cfg.controller_listener.bind_address if cfg.controller_listener else "",
            test_append=cfg.kraft_test_append_enable,
            event_loop=running_loop_name(),
            grpc_io=grpc_io_name(),
        )

    async def _start_server(self) -> None:
        cfg = self.config
        assert self._raft is not None and self._meta is not None and cfg.controller_listener is not None
        # Handshake and idle timeouts, keepalive, stream and connection caps: kraft.grpc_service.
        limits = server_limits(cfg)
        intake_socket: Path | None = None
        if cfg.controller_intake_processes > 0:
            # Intake processes bind this port too: the node's own socket must allow SO_REUSEPORT, and
            # serves them on a unix socket of its own (kraft/node/intake_pool.py).
            try:
                check_supported(cfg)
                intake_socket = socket_path(cfg)
                prepare_socket_dir(intake_socket)
                check_port_free(cfg.controller_listener.host, cfg.controller_listener.port)
            except IntakeConfigError as exc:
                raise StartupError(str(exc)) from None
            limits = dataclasses.replace(limits, reuseport=True)
        endpoints = self.endpoints()
        main_loop = asyncio.get_running_loop()
        # With the request plane on its own thread, Fetch is served there and reaches the driver through
        # the bridge (kraft.node.intake); without it, the servicer calls the driver directly.  The bridge
        # can be switched off (controller.raft.fetch.on.intake) for A/B runs: Fetch then hops like the rest.
        fetch_on_intake = cfg.controller_request_intake_thread and cfg.controller_raft_fetch_on_intake
        bridge = DriverBridge(main_loop, self._raft.submit_request) if fetch_on_intake else None
        if bridge is not None:  # Fetches that arrive during the leader's fsync wait for it, unposted
            self._raft.pull_during_flush(bridge)
        raft_servicer = RaftServicer(
            self._raft,
            cluster_id=self._meta.cluster_id,
            endpoints=endpoints,
            voter_changes=self._raft,
            listener_name=cfg.controller_listener_names[0],
            security_protocol=cfg.security_protocol(cfg.controller_listener_names[0]),
            node_id=cfg.node_id,
            peer_problems=self._raft.peer_problems.reports,
            fetch_handler=bridge,
        )
        health = HealthReporter()
        test_servicer: RaftTestServicer | None = None
        native_methods = FETCH_METHODS if fetch_on_intake else frozenset[str]()
        if cfg.kraft_test_append_enable:
            # The digest state machine writes snapshots only when nothing else runs on this node:
            # with the metadata layer installed, snapshots are the metadata image's.
            snapshot_every = 0 if self._installers else cfg.metadata_log_max_record_bytes_between_snapshots
            self.test_state = DigestStateMachine(self._raft, snapshot_every_bytes=snapshot_every)
            # On the intake thread the appends of many calls reach the driver in one hand-off each way.
            appends_on_intake = (
                cfg.controller_request_intake_thread and cfg.controller_raft_test_append_on_intake
            )
            test_servicer = RaftTestServicer(
                self._raft,
                self.test_state,
                cluster_id=self._meta.cluster_id,
                endpoints=endpoints,
                listener_name=cfg.controller_listener_names[0],
                security_protocol=cfg.security_protocol(cfg.controller_listener_names[0]),
                appends=AppendBridge(main_loop, self._raft) if appends_on_intake else None,
            )
            if appends_on_intake:
                native_methods |= APPEND_METHODS
        address = cfg.controller_listener.bind_address
        configured_port = cfg.controller_listener.port
        name = cfg.controller_listener.name
        tls = listener_settings(cfg, name)

        def build(interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] | None) -> grpc.aio.Server:
            """The server, on the loop that runs it (servicers are only registered here)."""
            server = create_server(limits, interceptors)
            add_raft_service(raft_servicer, server)
            health.register(server)
            if test_servicer is not None:
                add_raft_test_service(test_servicer, server)
            for install in self._installers:
                install(server)
            exclusive = intake_socket is not None and cfg.controller_intake_exclusive
            try:
                if exclusive:
                    # every connection reaches this process through an intake process (they bind the port)
                    self._bound_port = configured_port
                else:
                    self._bound_port, self.certificates = add_port(server, address, tls, name)
            except TlsError as exc:
                raise StartupError(f"cannot use the TLS configuration: {exc}") from None
            except RuntimeError as exc:
                raise StartupError(f"cannot listen on {address}: {exc}") from None
            if self._bound_port == 0:
                raise StartupError(f"cannot listen on {address} (port in use?)")
            if intake_socket is not None and server.add_insecure_port(f"unix:{intake_socket}") == 0:
                raise StartupError(f"cannot listen on the intake socket {intake_socket}")
            return server

        await health.set_serving(RAFT_SERVICE, False)
        self._health = health
        if cfg.controller_request_intake_thread:
            intake = self._intake = IntakeLoop()
            intake.start()
            replaced = {method: factory(main_loop) for method, factory in self._intake_handlers.items()}
            hop = HopInterceptor(main_loop, intake.loop, native=native_methods, replace=replaced)

            async def start_on_intake() -> grpc.aio.Server:
                server = build([hop])
                await server.start()
                return server

            self._server = await intake.run(start_on_intake())
            name_grpc_poller()  # gRPC's poller, if this server started it, is not a second intake thread
            leader_off = cfg.controller_leader_grpc_events_on_intake
            follower_off = cfg.controller_follower_grpc_events_on_main
            if leader_off or follower_off:

                async def on_intake(call: Callable[[], object]) -> object:
                    return call()

                self._poller_readers = LoopReaders(
                    main_loop,
                    intake.loop,
                    lambda call: intake.run(on_intake(call)),
                    self._log,
                    leader_off=leader_off,
                    follower_off=follower_off,
                )
        else:
            self._server = build(None)
            await self._server.start()
        if cfg.observability_stall_sampler_ms > 0:
            samplers = self._stall_samplers = StallSamplers(cfg.node_id, cfg.observability_stall_sampler_ms)
            samplers.watch_loop(main_loop, "main")
            if self._intake is not None:
                samplers.watch_loop(self._intake.loop, "intake")
            samplers.start()
        if intake_socket is not None:
            secure_socket(intake_socket)
            # Calls from the unix socket carry their callers' identity (kraft.security.principal).
            trust_intake_forwarding(tls=tls is not None)
            pool = self._intake_processes = IntakeProcesses(
                cfg.controller_intake_processes,
                listen=_join_host_port(cfg.controller_listener.host or "0.0.0.0", self._bound_port),
                upstream=intake_socket,
                cluster_id=self._meta.cluster_id,
                limits=limits,
                batch_appends=test_servicer is not None,
                batch_controller_calls=cfg.controller_intake_batch_controller_calls,
                log=self._log,
                listener=name,
                tls_config=write_tls_config(cfg, intake_socket.parent) if tls is not None else None,
            )
            try:
                await pool.start()
            except IntakeConfigError as exc:
                raise StartupError(str(exc)) from None

    def _intake_process_died(self, index: int, pid: int, status: int) -> None:
        if self.supervisor is not None:
            self.supervisor.fail("intake_process_died", index=index, pid=pid, exit_status=status)
        else:  # a node without a supervisor (in-process tests): its owner decides
            self._log.error("intake_process_died", index=index, pid=pid, exit_status=status)

    @property
    def intake_pids(self) -> list[int]:
        """The intake processes' pids (empty without them)."""
        return self._intake_processes.pids if self._intake_processes is not None else []

    async def _on_server_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a call on the server (wait_for_termination, stop) on the loop the server belongs to."""
        if self._intake is not None:
            return await self._intake.run(coro)
        return await coro

    async def _stop_server(self, grace: float) -> None:
        # The intake processes first: their callers reconnect (to this node's socket or another node)
        # while the node's server still answers what they forwarded.
        pool, self._intake_processes = self._intake_processes, None
        if pool is not None:
            await pool.stop(timeout_s=grace and STOP_INTAKE_TIMEOUT_S)
        readers, self._poller_readers = self._poller_readers, None
        if readers is not None:  # both loops read their own gRPC events again before the intake loop stops
            try:
                async with asyncio.timeout(INTAKE_STOP_TIMEOUT_S):  # a hop to the intake loop: bounded
                    await readers.restore()
            except TimeoutError:
                self._log.warning("grpc_poller_readers_not_restored", timeout_s=INTAKE_STOP_TIMEOUT_S)
        server, self._server = self._server, None
        if server is not None:
            await self._on_server_loop(server.stop(grace=grace))
        samplers, self._stall_samplers = self._stall_samplers, None
        if samplers is not None:
            samplers.stop()
        if self._intake is not None:
            self._intake.close()
            self._intake = None
        if pool is not None:
            stop_trusting_intake_forwarding()

    def own_endpoints(self) -> tuple[Endpoint, ...]:
        """This controller's endpoints as a VotersRecord stores them, as ``kraft quorum add-controller``
        sends them: its ``advertised.listeners`` entry for the CONTROLLER listener if any, else the
        listener (the bound port; a wildcard bind advertises the FQDN)."""
        listener = self.config.controller_listener
        assert listener is not None
        advertised = self.config.advertised(listener)
        if advertised is not listener:
            return (Endpoint(listener.name, advertised.host, advertised.port),)
        return (Endpoint(listener.name, advertised_host(listener.host), self._bound_port or listener.port),)

    def _voter_endpoint_updater(self) -> VoterEndpointUpdater:
        assert self._raft is not None and self._meta is not None
        security = outbound_security(self.config, self.config.controller_listener_names[0])

        async def send(
            target: str, request: raft_pb2.UpdateRaftVoterRequest, timeout_s: float
        ) -> raft_pb2.RaftVoterChangeResponse:
            channel = open_channel(target, [("grpc.enable_retries", 0)], security)
            try:
                stub = raft_pb2_grpc.RaftServiceStub(channel)
                response: raft_pb2.RaftVoterChangeResponse = await stub.UpdateRaftVoter(
                    request, timeout=timeout_s
                )
                return response
            finally:
                await channel.close(None)

        return VoterEndpointUpdater(
            self._raft,
            node_id=self.config.node_id,
            directory_id=self._meta.directory_id,
            cluster_id=self._meta.cluster_id,
            endpoints=self.own_endpoints,
            resolve=self._voter_address,
            send=send,
        )

    async def _watch_leadership(self) -> None:
        """Keep ``kraft.v1.RaftService`` health SERVING exactly while a leader is known, and the main loop
        off grpc.aio's wake-up socket exactly while this node leads, the intake loop exactly while it does
        not (:class:`LoopReaders`)."""
        serving: bool | None = None
        while True:
            leader: LeaderAndEpoch = self.raft.leader_and_epoch
            readers = self._poller_readers
            if readers is not None:  # a leader's main loop not woken by the intake's calls, nor a follower's
                await readers.follow(leader.leader_id == self.config.node_id)  # intake by its fetches
            if leader.has_leader != serving and self._health is not None:
                serving = leader.has_leader
                await self._health.set_serving(RAFT_SERVICE, serving)
            await asyncio.sleep(0.1)

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop gracefully (signal-handler safe)."""
        self._stop_requested.set()

    async def wait_stop_requested(self) -> None:
        await self._stop_requested.wait()

    async def stop(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> None:
        """Graceful: NOT_SERVING, stop hooks, resign via EndQuorumEpoch, stop the server, close storage."""
        self._log.info("controller_stopping")
        if self.supervisor is not None:
            self.supervisor.begin_stop()
        if self._health is not None:
            await self._health.shutdown()
        for hook in reversed(self._stop_hooks):
            await self._run_stop_hook(hook)
        for task in (self._watcher, self._endpoint_updater):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._raft is not None:
            try:
                await self._raft.shutdown(timeout_ms)
            except Exception:
                self._log.exception("raft_shutdown_failed")
        await self._close_resources()
        self._log.info("controller_stopped")

    async def _run_stop_hook(self, hook: NodeHook) -> None:
        # A hook that hangs (e.g. awaiting a task that swallows cancellation) must not keep the process
        # alive past SIGTERM: run it as a task, give it a bounded time, then abandon it and carry on.
        task = asyncio.ensure_future(hook(self))
        done, _ = await asyncio.wait({task}, timeout=STOP_HOOK_TIMEOUT_S)
        if not done:
            task.cancel()
            name = getattr(hook, "__qualname__", repr(hook))
            self._log.error("stop_hook_timed_out", hook=name, timeout_s=STOP_HOOK_TIMEOUT_S)
            return
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            name = getattr(hook, "__qualname__", repr(hook))
            self._log.error("stop_hook_failed", hook=name, error=repr(exc))

    async def abort(self) -> None:
        """After a fatal error: release the port and stop Raft like a crash — no resignation, no hooks, and
        the log is NOT closed (closing writes the clean-shutdown marker, a promise that the data on disk is
        complete, which a failed write or fsync broke; the next start recovers the log instead)."""
        for task in (self._watcher, self._endpoint_updater):
            if task is not None:
                task.cancel()
        await self._stop_server(grace=0)
        if self._raft is not None:
            await self._raft.stop()
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
        # The directory locks stay held: the process exits next and the kernel drops them only then,
        # so no second process opens the log while this one may still hold unflushed state.

    def _release_locks(self) -> None:
        if self._locks is not None:
            self._locks.release()
            self._locks = None

    async def _close_resources(self) -> None:
        # The server watch is not cancelled: cancelling grpc's wait_for_termination cancels the server's
        # own shutdown future (stop() then raises CancelledError); it ends by itself once the server stops.
        self._server_watch = None
        await self._stop_server(grace=0.5)
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
        if self._raft is not None:
            self._raft.close()
            self._raft = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self._release_locks()


async def run_controller(config: NodeConfig) -> None:
    """Start a controller with the metadata layer, run until SIGTERM/SIGINT, then stop gracefully.

    A fatal error at run time does not return: it logs one ``fatal`` line and exits with status 70
    (:mod:`kraft.node.supervisor`)."""
    supervisor = Supervisor(get_logger("controller", node=config.node_id))
    gc_watch.install()  # this process's GC pauses: kraft_gc_pause_seconds, a slow event's gc_ms
    gc_watch.tune_node_gc()  # the collector's thresholds for a node's heap ($KRAFT_GC_THRESHOLD for A/B runs)
    node = ControllerNode(config, supervisor)
    if not config.kraft_test_append_enable:
        # With the test-only append path on, the log holds raw test records, not metadata: the node
        # then runs Raft alone (and the digest state machine owns snapshots).
        install_metadata_layer(node)
    loop = asyncio.get_running_loop()
    # Handlers stay until the loop closes: a second SIGTERM during shutdown must not kill the process.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, node.request_stop)
    try:
        await node.start()
    except StartupError:
        raise  # nothing runs yet: one `error:` line, exit 1
    except Exception as exc:
        # A start hook failed with Raft and the server already running (the image store cannot be opened
        # on a full disk): fatal like the same error a second later — a component that knows why reported
        # it first (image_store_write_failed), anything else is start_failed; never a traceback and exit 1.
        supervisor.fail("start_failed", exc)
    failure = await supervisor.wait(node.wait_stop_requested())
    if failure is not None:
        await supervisor.fail_stop(node.abort)
    await node.stop()
