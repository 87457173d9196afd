"""Builds a controller's Raft node from its configuration: storage adapters + core config + driver.

``open_raft`` is what :mod:`kraft.raft.process` calls; tests build :class:`RaftDriver` directly with the
in-memory ports instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from kraft.config import NodeConfig
from kraft.raft.client import RaftClient
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import SystemClock
from kraft.raft.storage_adapters import FileElectionStore, FileSnapshotStore, SegmentedLogStore
from kraft.raft.transport import RequestHandler, Transport
from kraft.storage.log import METADATA_LOG_DIR_NAME, LogConfig
from kraft.storage.meta_properties import MetaProperties


def raft_config_from(cfg: NodeConfig, cluster_id: str) -> RaftConfig:
    """Kafka's ``controller.quorum.*`` keys → :class:`RaftConfig`."""
    return RaftConfig(
        node_id=cfg.node_id,
        voters=tuple(sorted(cfg.voter_ids)),
        cluster_id=cluster_id,
        election_timeout_ms=cfg.controller_quorum_election_timeout_ms,
        fetch_timeout_ms=cfg.controller_quorum_fetch_timeout_ms,
        election_backoff_max_ms=cfg.controller_quorum_election_backoff_max_ms,
        append_linger_ms=cfg.controller_quorum_append_linger_ms,
        request_timeout_ms=cfg.controller_quorum_request_timeout_ms,
        retry_backoff_ms=cfg.controller_quorum_retry_backoff_ms,
        fetch_max_wait_ms=cfg.controller_quorum_fetch_max_wait_ms,
        # A fetch response must fit in one gRPC message, with room for the envelope.
        fetch_max_bytes=min(8 * 1024 * 1024, cfg.grpc_max_message_bytes - 64 * 1024),
        max_batch_bytes=min(1024 * 1024, cfg.grpc_max_message_bytes // 4),
    )


def metadata_partition_dir(cfg: NodeConfig) -> Path:
    base = cfg.metadata_log_dir if cfg.metadata_log_dir is not None else cfg.all_log_dirs[0]
    return Path(base) / METADATA_LOG_DIR_NAME


@dataclass
class RaftHandle:
    """What the controller process holds: the client API, the inbound handler, lifecycle calls."""

    driver: RaftDriver

    @property
    def client(self) -> RaftClient:
        return self.driver

    @property
    def handler(self) -> RequestHandler:
        return self.driver

    async def start(self) -> None:
        await self.driver.start()

    async def shutdown(self, timeout_ms: int) -> None:
        await self.driver.shutdown(timeout_ms)

    def close(self) -> None:
        self.driver.close()


async def open_raft(cfg: NodeConfig, meta: MetaProperties, transport: Transport) -> RaftHandle:
    """Open (and recover) the metadata log, quorum-state and snapshots, and build the driver."""
    directory = metadata_partition_dir(cfg)
    log_config = LogConfig(
        segment_bytes=cfg.metadata_log_segment_bytes, segment_ms=cfg.metadata_log_segment_ms
    )
    log = await asyncio.to_thread(SegmentedLogStore.open, directory, log_config)
    driver = RaftDriver(
        raft_config_from(cfg, meta.cluster_id),
        transport=transport,
        log=log,
        elections=FileElectionStore(directory),
        snapshots=FileSnapshotStore(directory),
        clock=SystemClock(),
    )
    return RaftHandle(driver)
