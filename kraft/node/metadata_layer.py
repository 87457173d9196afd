"""Installs the metadata layer on a controller node (:class:`kraft.node.controller.ControllerNode`).

``install_metadata_layer(node)`` must be called before ``node.start()``: it adds ControllerService to
the node's server, creates the :class:`QuorumController` once Raft runs (``on_start``), keeps the
``kraft.v1.ControllerService`` health status SERVING exactly while this node is the active controller,
and stops the controller first on shutdown (``on_stop``).  The image store lives next to the metadata
log: ``<metadata.log.dir>/metadata-image.sqlite``.

The image store is a cache of the local snapshot + log (issue #14): a store whose offset is at or above
the local log's end offset claims records this log never had (an edited store, or one copied from
elsewhere) and is discarded before the controller loads it (one ``image_store_discarded`` line); one that
fails its checksum is discarded by :meth:`kraft.metadata.store.SqliteImageStore.load`.  Either way the
image is rebuilt by replaying the local snapshot and log.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from kraft.clock import SystemClock
from kraft.config import NodeConfig
from kraft.metadata.bootstrap import read_bootstrap_features
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.request_limits import RequestLimits
from kraft.metadata.service import ControllerServicer, add_controller_service
from kraft.metadata.store import IMAGE_STORE_FILE, SqliteImageStore
from kraft.node.batch_lane import CALL_BATCH_METHOD, BatchLane
from kraft.node.controller_bridge import HeartbeatBridge, heartbeat_handler
from kraft.node.heartbeat_stream import HEARTBEAT_STREAM_METHOD, heartbeat_stream_handler
from kraft.node.intake_batch import HEARTBEAT_METHOD, CallBatchServicer, add_intake_service
from kraft.observability.health import CONTROLLER_SERVICE
from kraft.observability.stall_sampler import ArrivalProbe
from kraft.raft.driver import RaftDriver
from kraft.security.authorizer import AuthorizerSettings

if TYPE_CHECKING:
    # Type-only: controller.py imports this module to install the layer in run_controller.
    from kraft.node.controller import ControllerNode


def options_from_config(config: NodeConfig) -> ControllerOptions:
    """The controller's options; StorageStateError when the bootstrap checkpoint is damaged."""
    bootstrap = (
        None if config.metadata_log_dir is None else read_bootstrap_features(Path(config.metadata_log_dir))
    )
    options = ControllerOptions(
        session_timeout_ms=config.broker_session_timeout_ms,
        heartbeat_interval_ms=config.broker_heartbeat_interval_ms,
        noop_interval_ms=config.metadata_max_idle_interval_ms,
        store_bulk_defer_max_ms=config.controller_image_store_bulk_defer_max_ms,
        store_save_pause_percent=config.controller_image_store_save_pause_percent,
        store_bulk_save_stagger_ms=config.controller_image_store_bulk_save_stagger_ms,
        create_topics_preparing_max=config.controller_create_topics_preparing_max,
        snapshot_max_bytes=config.metadata_log_max_record_bytes_between_snapshots,
        snapshot_interval_ms=config.metadata_log_max_snapshot_interval_ms,
        default_num_partitions=config.num_partitions,
        default_replication_factor=config.default_replication_factor,
        leader_lease_ms=config.controller_quorum_fetch_timeout_ms,
        max_partitions=config.max_partitions,
        max_broker_partitions=config.max_broker_partitions,
        min_insync_replicas=config.min_insync_replicas,
        unclean_leader_election_enable=config.unclean_leader_election_enable,
        request_limits=RequestLimits(config.max_request_topics, config.max_request_partitions),
        metadata_fetch_max_wait_ms=config.metadata_fetch_max_wait_ms,
        max_parked_fetches=config.fetch_max_parked_requests,
        max_work_unit_records=config.controller_max_work_unit_records,
        max_event_time_ms=config.controller_max_event_time_ms,
        controller_listener_name=config.controller_listener_names[0],
        controller_security_protocol=config.security_protocol(config.controller_listener_names[0]),
    )
    return options if bootstrap is None else replace(options, bootstrap_features=bootstrap)


def image_store_path(config: NodeConfig) -> Path | None:
    return None if config.metadata_log_dir is None else Path(config.metadata_log_dir) / IMAGE_STORE_FILE


def discard_store_ahead_of_log(path: Path | None, log_end_offset: int) -> bool:
    """Delete the image store when it claims an offset the local log never reached; True if it did."""
    if path is None:
        return False
    stored = SqliteImageStore.stored_offset(path)
    if stored is None or stored < log_end_offset:
        return False
    SqliteImageStore.discard_file(
        path, f"ahead of the local log: image offset {stored} >= log end offset {log_end_offset}"
    )
    return True


def _fast_lane_lease(node: ControllerNode) -> Callable[[], int] | None:
    """The Raft leader lease the heartbeat fast lane answers under, when it is on
    (controller.broker.heartbeats.fast.lane, with the intake thread it runs on)."""
    cfg = node.config
    raft = node.raft
    on = cfg.controller_request_intake_thread and cfg.controller_broker_heartbeats_fast_lane
    return raft.leader_lease_expiry_ms if on and isinstance(raft, RaftDriver) else None


class MetadataLayer:
    """What :func:`install_metadata_layer` returns: the servicer and, once started, the controller."""

    def __init__(self, authorizer: AuthorizerSettings | None = None) -> None:
        self.servicer = ControllerServicer(authorizer=authorizer)
        self.controller: QuorumController | None = None
        self.heartbeats: HeartbeatBridge | None = None  # with controller.broker.heartbeats.on.intake
        self.batch_lane: BatchLane | None = None  # with intake processes and the heartbeat fast lane
        self._health_task: asyncio.Task[None] | None = None

    async def start(self, node: ControllerNode) -> None:
        discard_store_ahead_of_log(image_store_path(node.config), node.log_end_offset)
        controller = QuorumController(
            node.raft,
            node.cluster_id,
            node.endpoints(),
            options_from_config(node.config),
            store_path=image_store_path(node.config),
            clock=SystemClock(),
            on_fatal=None if node.supervisor is None else node.supervisor.fail,
            lease_expiry_ms=_fast_lane_lease(node),
            endpoint_of=node.voter_endpoint,
            voters_in_force=node.voters_in_force,
        )
        await controller.start()
        self.controller = controller
        self.servicer.bind(controller)
        self._health_task = asyncio.create_task(
            self._report_health(node, controller), name="controller-health"
        )
        node.watch(self._health_task, "controller-health")
        for task in controller.background_tasks:
            node.watch(task, task.get_name())

    async def stop(self, node: ControllerNode) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        controller, self.controller = self.controller, None
        self.servicer.bind(None)
        if controller is not None:
            await controller.stop()

    @staticmethod
    async def _report_health(node: ControllerNode, controller: QuorumController) -> None:
        serving: bool | None = None
        while True:
            if controller.is_active != serving:
                serving = controller.is_active
                with contextlib.suppress(Exception):
                    await node.health.set_serving(CONTROLLER_SERVICE, serving)
            await asyncio.sleep(0.1)


# gRPC's completion-queue thread needs the GIL for every event it hands to the event loop (a unary call
# takes several).  While the loop thread is busy (bulk writes), a waiting thread gets the GIL only every
# switch interval — 5 ms by default, i.e. a few dozen calls per second, so heartbeats queued for
# seconds behind a busy but responsive loop.  A short interval costs nothing without contention.
GIL_SWITCH_INTERVAL_S = 0.0001


def install_metadata_layer(node: ControllerNode) -> MetadataLayer:
    # controller.gil.switch.interval.us: GIL_SWITCH_INTERVAL_S unless set (for A/B measurements)
    sys.setswitchinterval(node.config.controller_gil_switch_interval_us / 1e6)
    layer = MetadataLayer(node.config.authorizer_settings)
    node.add_service(lambda server: add_controller_service(server, layer.servicer))
    cfg = node.config
    if cfg.controller_request_intake_thread and (
        cfg.controller_broker_heartbeats_on_intake or cfg.controller_broker_heartbeats_fast_lane
    ):
        # Heartbeats of one intake turn reach the controller as one event (kraft/node/controller_bridge.py).
        def heartbeats(main: asyncio.AbstractEventLoop) -> grpc.RpcMethodHandler[Any, Any]:
            layer.heartbeats = HeartbeatBridge(main, lambda: layer.servicer.guard, lambda: layer.controller)
            if cfg.observability_stall_sampler_ms > 0:
                probe = ArrivalProbe(cfg.node_id)
                layer.heartbeats.arrival_probe = probe  # unary calls
                layer.heartbeats.message_probe = probe.message  # BrokerHeartbeatStream messages
            return heartbeat_handler(layer.heartbeats)

        node.add_intake_handler(HEARTBEAT_METHOD, heartbeats)

        def heartbeat_stream(main: asyncio.AbstractEventLoop) -> grpc.RpcMethodHandler[Any, Any]:
            # the same bridge (built just before: the node builds the handlers in the order added)
            assert layer.heartbeats is not None
            return heartbeat_stream_handler(layer.heartbeats)

        # A broker's heartbeats over one stream, each message served as the unary call is
        # (kraft/node/heartbeat_stream.py).
        node.add_intake_handler(HEARTBEAT_STREAM_METHOD, heartbeat_stream)
    if node.config.controller_intake_processes > 0:
        # Its intake processes' batched ControllerService calls (refused off the unix socket).
        batches = CallBatchServicer(layer.servicer, lambda: layer.controller, node.config.node_id)
        node.add_service(lambda server: add_intake_service(server, batches))
        if cfg.controller_request_intake_thread and cfg.controller_broker_heartbeats_fast_lane:
            # Their steady heartbeats answered by the fast lane on the intake thread, the rest of each
            # batch on the main loop as before (kraft/node/batch_lane.py).
            lane = BatchLane(batches, lambda: layer.heartbeats, lambda: layer.controller)
            batches.on_admitted = lane.grant
            layer.batch_lane = lane
            node.add_intake_handler(CALL_BATCH_METHOD, lane.handler)
    node.on_start(layer.start)
    node.on_stop(layer.stop)
    return layer
