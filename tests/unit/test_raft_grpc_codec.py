"""Every Raft dataclass survives dataclass → protobuf → bytes → protobuf → dataclass unchanged."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.v1 import raft_pb2

int32 = st.integers(min_value=-1, max_value=2**31 - 1)
int64 = st.integers(min_value=-1, max_value=2**63 - 1)
codes = st.sampled_from(list(ErrorCode))
text = st.text(max_size=20)
snapshot_ids = st.builds(m.SnapshotId, end_offset=int64, epoch=int32)
replicas = st.builds(
    m.ReplicaState,
    replica_id=int32,
    log_end_offset=int64,
    last_fetch_timestamp_ms=int64,
    last_caught_up_timestamp_ms=int64,
)


def _through_wire(encoded: Any) -> Any:
    """Serialize and parse back, as gRPC does."""
    parsed = type(encoded)()
    parsed.ParseFromString(encoded.SerializeToString())
    return parsed


@given(st.builds(m.VoteRequest, text, int32, int32, int32, int32, int64, st.booleans()))
def test_vote_request_round_trips(value: m.VoteRequest) -> None:
    assert codec.vote_request_from_pb(_through_wire(codec.vote_request_to_pb(value))) == value


@given(st.builds(m.VoteResponse, codes, text, int32, int32, st.booleans(), st.booleans()))
def test_vote_response_round_trips(value: m.VoteResponse) -> None:
    assert codec.vote_response_from_pb(_through_wire(codec.vote_response_to_pb(value))) == value


@given(st.builds(m.BeginQuorumEpochRequest, text, int32, int32, int32))
def test_begin_quorum_epoch_request_round_trips(value: m.BeginQuorumEpochRequest) -> None:
    assert codec.begin_request_from_pb(_through_wire(codec.begin_request_to_pb(value))) == value


@given(st.builds(m.BeginQuorumEpochResponse, codes, text, int32, int32))
def test_begin_quorum_epoch_response_round_trips(value: m.BeginQuorumEpochResponse) -> None:
    assert codec.begin_response_from_pb(_through_wire(codec.begin_response_to_pb(value))) == value


@given(st.builds(m.EndQuorumEpochRequest, text, int32, int32, int32, st.lists(int32).map(tuple)))
def test_end_quorum_epoch_request_round_trips(value: m.EndQuorumEpochRequest) -> None:
    assert codec.end_request_from_pb(_through_wire(codec.end_request_to_pb(value))) == value


@given(st.builds(m.EndQuorumEpochResponse, codes, text, int32, int32))
def test_end_quorum_epoch_response_round_trips(value: m.EndQuorumEpochResponse) -> None:
    assert codec.end_response_from_pb(_through_wire(codec.end_response_to_pb(value))) == value


@given(st.builds(m.FetchRequest, text, int32, int32, int64, int32, int32, int32))
def test_fetch_request_round_trips(value: m.FetchRequest) -> None:
    assert codec.fetch_request_from_pb(_through_wire(codec.fetch_request_to_pb(value))) == value


@given(
    st.builds(
        m.FetchResponse,
        codes,
        text,
        int32,
        int32,
        int64,
        int64,
        st.binary(max_size=64),
        st.none() | st.builds(m.EpochEndOffset, int32, int64),
        st.none() | snapshot_ids,
    )
)
def test_fetch_response_round_trips(value: m.FetchResponse) -> None:
    assert codec.fetch_response_from_pb(_through_wire(codec.fetch_response_to_pb(value))) == value


def test_fetch_response_keeps_zero_valued_diverging_epoch_and_snapshot_id() -> None:
    # proto3 drops zero scalars; presence (optional) must still tell "set to zeros" from "absent".
    value = m.FetchResponse(
        ErrorCode.NONE, "", 1, 0, diverging_epoch=m.EpochEndOffset(0, 0), snapshot_id=m.SnapshotId(0, 0)
    )
    assert codec.fetch_response_from_pb(_through_wire(codec.fetch_response_to_pb(value))) == value


@given(st.builds(m.FetchSnapshotRequest, text, int32, int32, snapshot_ids, int64, int32))
def test_fetch_snapshot_request_round_trips(value: m.FetchSnapshotRequest) -> None:
    encoded = _through_wire(codec.fetch_snapshot_request_to_pb(value))
    assert codec.fetch_snapshot_request_from_pb(encoded) == value


@given(
    st.builds(
        m.FetchSnapshotResponse,
        codes,
        text,
        int32,
        int32,
        st.none() | snapshot_ids,
        int64,
        int64,
        st.binary(max_size=64),
    )
)
def test_fetch_snapshot_response_round_trips(value: m.FetchSnapshotResponse) -> None:
    encoded = _through_wire(codec.fetch_snapshot_response_to_pb(value))
    assert codec.fetch_snapshot_response_from_pb(encoded) == value


@given(
    st.builds(
        m.DescribeQuorumResponse,
        codes,
        text,
        int32,
        int32,
        int64,
        st.lists(replicas, max_size=5).map(tuple),
        st.lists(replicas, max_size=3).map(tuple),
    )
)
def test_describe_quorum_response_round_trips(value: m.DescribeQuorumResponse) -> None:
    encoded = _through_wire(codec.describe_response_to_pb(value))
    assert codec.describe_response_from_pb(encoded) == value


def test_describe_quorum_response_carries_known_directory_ids() -> None:
    voters = (m.ReplicaState(1, 10, 5, 5), m.ReplicaState(2, 9, 4, 4))
    value = m.DescribeQuorumResponse(ErrorCode.NONE, "", 1, 3, 10, voters)
    encoded = codec.describe_response_to_pb(value, {1: "dir-1"})
    assert [r.directory_id for r in encoded.current_voters] == ["dir-1", ""]


def test_unknown_error_code_from_a_newer_peer_decodes_as_unknown_server_error() -> None:
    encoded = raft_pb2.VoteResponse(error_code=9999, leader_id=-1)
    assert codec.vote_response_from_pb(encoded).error_code is ErrorCode.UNKNOWN_SERVER_ERROR
