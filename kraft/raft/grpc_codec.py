"""Protobuf (``kraft.v1.raft_pb2``) ↔ dataclass (:mod:`kraft.raft.messages`) mapping.

One pair of functions per message, field by field, no reflection: Fetch runs thousands of times a second
and this is its hot path.  Field names are identical on both sides; the only shape differences are
``optional`` sub-messages (``None`` on the dataclass side) and ``int`` error codes (:class:`ErrorCode`).
"""

from __future__ import annotations

from kraft.errors import ErrorCode
from kraft.raft import messages as m
from kraft.v1 import raft_pb2 as pb

# --- shared sub-messages ---


def _snapshot_id_to_pb(value: m.SnapshotId) -> pb.SnapshotId:
    return pb.SnapshotId(end_offset=value.end_offset, epoch=value.epoch)


def _snapshot_id_from_pb(value: pb.SnapshotId) -> m.SnapshotId:
    return m.SnapshotId(end_offset=value.end_offset, epoch=value.epoch)


def _replica_to_pb(value: m.ReplicaState, directory_id: str = "") -> pb.ReplicaState:
    return pb.ReplicaState(
        replica_id=value.replica_id,
        log_end_offset=value.log_end_offset,
        last_fetch_timestamp_ms=value.last_fetch_timestamp_ms,
        last_caught_up_timestamp_ms=value.last_caught_up_timestamp_ms,
        directory_id=directory_id,
    )


def _replica_from_pb(value: pb.ReplicaState) -> m.ReplicaState:
    return m.ReplicaState(
        replica_id=value.replica_id,
        log_end_offset=value.log_end_offset,
        last_fetch_timestamp_ms=value.last_fetch_timestamp_ms,
        last_caught_up_timestamp_ms=value.last_caught_up_timestamp_ms,
    )


# --- Vote ---


def vote_request_to_pb(value: m.VoteRequest) -> pb.VoteRequest:
    return pb.VoteRequest(
        cluster_id=value.cluster_id,
        candidate_epoch=value.candidate_epoch,
        candidate_id=value.candidate_id,
        voter_id=value.voter_id,
        last_offset_epoch=value.last_offset_epoch,
        last_offset=value.last_offset,
        pre_vote=value.pre_vote,
    )


def vote_request_from_pb(value: pb.VoteRequest) -> m.VoteRequest:
    return m.VoteRequest(
        cluster_id=value.cluster_id,
        candidate_epoch=value.candidate_epoch,
        candidate_id=value.candidate_id,
        voter_id=value.voter_id,
        last_offset_epoch=value.last_offset_epoch,
        last_offset=value.last_offset,
        pre_vote=value.pre_vote,
    )


def vote_response_to_pb(value: m.VoteResponse) -> pb.VoteResponse:
    return pb.VoteResponse(
        error_code=int(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        vote_granted=value.vote_granted,
        pre_vote=value.pre_vote,
    )


def vote_response_from_pb(value: pb.VoteResponse) -> m.VoteResponse:
    return m.VoteResponse(
        error_code=ErrorCode.from_wire(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        vote_granted=value.vote_granted,
        pre_vote=value.pre_vote,
    )


# --- BeginQuorumEpoch / EndQuorumEpoch ---


def begin_request_to_pb(value: m.BeginQuorumEpochRequest) -> pb.BeginQuorumEpochRequest:
    return pb.BeginQuorumEpochRequest(
        cluster_id=value.cluster_id,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        voter_id=value.voter_id,
    )


def begin_request_from_pb(value: pb.BeginQuorumEpochRequest) -> m.BeginQuorumEpochRequest:
    return m.BeginQuorumEpochRequest(
        cluster_id=value.cluster_id,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        voter_id=value.voter_id,
    )


def begin_response_to_pb(value: m.BeginQuorumEpochResponse) -> pb.BeginQuorumEpochResponse:
    return pb.BeginQuorumEpochResponse(
        error_code=int(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
    )


def begin_response_from_pb(value: pb.BeginQuorumEpochResponse) -> m.BeginQuorumEpochResponse:
    return m.BeginQuorumEpochResponse(
        error_code=ErrorCode.from_wire(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
    )


def end_request_to_pb(value: m.EndQuorumEpochRequest) -> pb.EndQuorumEpochRequest:
    return pb.EndQuorumEpochRequest(
        cluster_id=value.cluster_id,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        voter_id=value.voter_id,
        preferred_successors=value.preferred_successors,
    )


def end_request_from_pb(value: pb.EndQuorumEpochRequest) -> m.EndQuorumEpochRequest:
    return m.EndQuorumEpochRequest(
        cluster_id=value.cluster_id,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        voter_id=value.voter_id,
        preferred_successors=tuple(value.preferred_successors),
    )


def end_response_to_pb(value: m.EndQuorumEpochResponse) -> pb.EndQuorumEpochResponse:
    return pb.EndQuorumEpochResponse(
        error_code=int(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
    )


def end_response_from_pb(value: pb.EndQuorumEpochResponse) -> m.EndQuorumEpochResponse:
    return m.EndQuorumEpochResponse(
        error_code=ErrorCode.from_wire(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
    )


# --- Fetch ---


def fetch_request_to_pb(value: m.FetchRequest, directory_id: str = "") -> pb.FetchRequest:
    return pb.FetchRequest(
        cluster_id=value.cluster_id,
        replica_id=value.replica_id,
        current_leader_epoch=value.current_leader_epoch,
        fetch_offset=value.fetch_offset,
        last_fetched_epoch=value.last_fetched_epoch,
        max_wait_ms=value.max_wait_ms,
        max_bytes=value.max_bytes,
        replica_directory_id=directory_id,
    )


def fetch_request_from_pb(value: pb.FetchRequest) -> m.FetchRequest:
    return m.FetchRequest(
        cluster_id=value.cluster_id,
        replica_id=value.replica_id,
        current_leader_epoch=value.current_leader_epoch,
        fetch_offset=value.fetch_offset,
        last_fetched_epoch=value.last_fetched_epoch,
        max_wait_ms=value.max_wait_ms,
        max_bytes=value.max_bytes,
    )


def fetch_response_to_pb(value: m.FetchResponse) -> pb.FetchResponse:
    out = pb.FetchResponse(
        error_code=int(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        high_watermark=value.high_watermark,
        log_start_offset=value.log_start_offset,
        records=value.records,
    )
    if value.diverging_epoch is not None:
        out.diverging_epoch.epoch = value.diverging_epoch.epoch
        out.diverging_epoch.end_offset = value.diverging_epoch.end_offset
    if value.snapshot_id is not None:
        out.snapshot_id.end_offset = value.snapshot_id.end_offset
        out.snapshot_id.epoch = value.snapshot_id.epoch
    return out


def fetch_response_from_pb(value: pb.FetchResponse) -> m.FetchResponse:
    diverging = None
    if value.HasField("diverging_epoch"):
        diverging = m.EpochEndOffset(value.diverging_epoch.epoch, value.diverging_epoch.end_offset)
    snapshot = _snapshot_id_from_pb(value.snapshot_id) if value.HasField("snapshot_id") else None
    return m.FetchResponse(
        error_code=ErrorCode.from_wire(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        high_watermark=value.high_watermark,
        log_start_offset=value.log_start_offset,
        records=value.records,
        diverging_epoch=diverging,
        snapshot_id=snapshot,
    )


# --- FetchSnapshot ---


def fetch_snapshot_request_to_pb(value: m.FetchSnapshotRequest) -> pb.FetchSnapshotRequest:
    return pb.FetchSnapshotRequest(
        cluster_id=value.cluster_id,
        replica_id=value.replica_id,
        current_leader_epoch=value.current_leader_epoch,
        snapshot_id=_snapshot_id_to_pb(value.snapshot_id),
        position=value.position,
        max_bytes=value.max_bytes,
    )


def fetch_snapshot_request_from_pb(value: pb.FetchSnapshotRequest) -> m.FetchSnapshotRequest:
    return m.FetchSnapshotRequest(
        cluster_id=value.cluster_id,
        replica_id=value.replica_id,
        current_leader_epoch=value.current_leader_epoch,
        snapshot_id=_snapshot_id_from_pb(value.snapshot_id),
        position=value.position,
        max_bytes=value.max_bytes,
    )


def fetch_snapshot_response_to_pb(value: m.FetchSnapshotResponse) -> pb.FetchSnapshotResponse:
    out = pb.FetchSnapshotResponse(
        error_code=int(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        size=value.size,
        position=value.position,
        unaligned_records=value.unaligned_records,
    )
    if value.snapshot_id is not None:
        out.snapshot_id.end_offset = value.snapshot_id.end_offset
        out.snapshot_id.epoch = value.snapshot_id.epoch
    return out


def fetch_snapshot_response_from_pb(value: pb.FetchSnapshotResponse) -> m.FetchSnapshotResponse:
    snapshot = _snapshot_id_from_pb(value.snapshot_id) if value.HasField("snapshot_id") else None
    return m.FetchSnapshotResponse(
        error_code=ErrorCode.from_wire(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        snapshot_id=snapshot,
        size=value.size,
        position=value.position,
        unaligned_records=value.unaligned_records,
    )


# --- DescribeQuorum ---


def describe_request_to_pb(value: m.DescribeQuorumRequest) -> pb.DescribeQuorumRequest:
    return pb.DescribeQuorumRequest(cluster_id=value.cluster_id)


def describe_request_from_pb(value: pb.DescribeQuorumRequest) -> m.DescribeQuorumRequest:
    return m.DescribeQuorumRequest(cluster_id=value.cluster_id)


def describe_response_to_pb(
    value: m.DescribeQuorumResponse, directory_ids: dict[int, str] | None = None
) -> pb.DescribeQuorumResponse:
    """``directory_ids`` (replica id → meta.properties directory.id) fills what the core does not track."""
    dirs = directory_ids or {}
    return pb.DescribeQuorumResponse(
        error_code=int(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        high_watermark=value.high_watermark,
        current_voters=[_replica_to_pb(r, dirs.get(r.replica_id, "")) for r in value.current_voters],
        observers=[_replica_to_pb(r, dirs.get(r.replica_id, "")) for r in value.observers],
    )


def describe_response_from_pb(value: pb.DescribeQuorumResponse) -> m.DescribeQuorumResponse:
    return m.DescribeQuorumResponse(
        error_code=ErrorCode.from_wire(value.error_code),
        error_message=value.error_message,
        leader_id=value.leader_id,
        leader_epoch=value.leader_epoch,
        high_watermark=value.high_watermark,
        current_voters=tuple(_replica_from_pb(r) for r in value.current_voters),
        observers=tuple(_replica_from_pb(r) for r in value.observers),
    )
