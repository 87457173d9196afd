"""Every Raft dataclass survives dataclass → protobuf → bytes → protobuf → dataclass unchanged, and the
bytes on the wire stay exactly what older and newer peers expect (pinned golden encodings)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.v1 import raft_pb2

# Full signed ranges: proto3 encodes negative int32/int64 as ten-byte varints, the edge most likely to break.
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
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
    decoded = codec.end_request_from_pb(_through_wire(codec.end_request_to_pb(value)))
    assert decoded == value
    assert type(decoded.preferred_successors) is tuple  # the dataclass is hashable only with a tuple


@given(st.builds(m.EndQuorumEpochResponse, codes, text, int32, int32))
def test_end_quorum_epoch_response_round_trips(value: m.EndQuorumEpochResponse) -> None:
    assert codec.end_response_from_pb(_through_wire(codec.end_response_to_pb(value))) == value


@given(st.builds(m.FetchRequest, text, int32, int32, int64, int32, int32, int32))
def test_fetch_request_round_trips(value: m.FetchRequest) -> None:
    assert codec.fetch_request_from_pb(_through_wire(codec.fetch_request_to_pb(value))) == value


@given(st.builds(m.FetchRequest, text, int32, int32, int64, int32, int32, int32, text, int64))
def test_fetch_request_carries_the_fetchers_directory_id_and_read_round(value: m.FetchRequest) -> None:
    encoded = _through_wire(codec.fetch_request_to_pb(value))
    assert encoded.replica_directory_id == value.replica_directory_id
    assert codec.fetch_request_from_pb(encoded) == value


@given(
    st.builds(
        m.FetchRequest, text, int32, int32, int64, int32, int32, int32, high_watermark=st.none() | int64
    )
)
def test_fetch_request_carries_the_known_high_watermark_with_presence(value: m.FetchRequest) -> None:
    # Unset must stay None, never 0: a leader would take an older fetcher's 0 as "knows nothing" and
    # answer every one of its long polls at once.
    encoded = _through_wire(codec.fetch_request_to_pb(value))
    assert encoded.HasField("high_watermark") is (value.high_watermark is not None)
    assert codec.fetch_request_from_pb(encoded) == value


@given(st.builds(m.VoteRequest, text, int32, int32, int32, int32, int64, st.booleans(), text, text))
def test_vote_request_carries_both_directory_ids(value: m.VoteRequest) -> None:
    encoded = _through_wire(codec.vote_request_to_pb(value))
    assert (encoded.candidate_directory_id, encoded.voter_directory_id) == (
        value.candidate_directory_id,
        value.voter_directory_id,
    )
    assert codec.vote_request_from_pb(encoded) == value


@given(st.builds(m.BeginQuorumEpochRequest, text, int32, int32, int32, text))
def test_begin_quorum_epoch_request_carries_the_voters_directory_id(value: m.BeginQuorumEpochRequest) -> None:
    encoded = _through_wire(codec.begin_request_to_pb(value))
    assert encoded.voter_directory_id == value.voter_directory_id
    assert codec.begin_request_from_pb(encoded) == value


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
        int64,
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


def test_fetch_response_without_diverging_epoch_or_snapshot_id_sets_neither() -> None:
    encoded = _through_wire(codec.fetch_response_to_pb(m.FetchResponse(ErrorCode.NONE, "", 1, 0)))
    assert not encoded.HasField("diverging_epoch")
    assert not encoded.HasField("snapshot_id")


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


@given(st.builds(m.DescribeQuorumRequest, text))
def test_describe_quorum_request_carries_the_cluster_id(value: m.DescribeQuorumRequest) -> None:
    # The server reads the request's cluster_id directly (an empty one means "this cluster"), so there is
    # no decoder to round-trip through.
    assert _through_wire(codec.describe_request_to_pb(value)).cluster_id == value.cluster_id


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
    voters = (m.ReplicaState(1, 10, 5, 5, "dir-1"), m.ReplicaState(2, 9, 4, 4))
    observers = (m.ReplicaState(7, 0, -1, -1, "dir-7"),)
    value = m.DescribeQuorumResponse(ErrorCode.NONE, "", 1, 3, 10, voters, observers)
    encoded = codec.describe_response_to_pb(value)
    assert [r.directory_id for r in encoded.current_voters] == ["dir-1", ""]
    assert [r.directory_id for r in encoded.observers] == ["dir-7"]


def test_unknown_error_code_from_a_newer_peer_decodes_as_unknown_server_error() -> None:
    encoded = raft_pb2.VoteResponse(error_code=9999, leader_id=-1)
    assert codec.vote_response_from_pb(encoded).error_code is ErrorCode.UNKNOWN_SERVER_ERROR


# --- wire format: golden encodings ---
#
# Captured from the hand-written codec this module replaced; any change here is a wire format change that
# breaks mixed-version clusters.
_REPLICAS = (
    m.ReplicaState(1, 4000, 1700000000000, 1700000000000, "dir-1"),
    m.ReplicaState(2, 3990, 1700000000001, -1),
)
_GOLDEN: list[tuple[str, Any, str]] = [
    (
        "vote_request",
        codec.vote_request_to_pb(m.VoteRequest("cluster-a", 7, 2, 3, 6, 1234567890123, True)),
        "0a09636c75737465722d61100718022003280630cb89ec8ff7233801",
    ),
    (
        "vote_response",
        codec.vote_response_to_pb(m.VoteResponse(ErrorCode.FENCED_LEADER_EPOCH, "fenced", 1, 9, False, True)),
        "084a120666656e636564180120093001",
    ),
    (
        "begin_quorum_epoch_request",
        codec.begin_request_to_pb(m.BeginQuorumEpochRequest("cluster-a", 1, 9, 3)),
        "0a09636c75737465722d61100118092003",
    ),
    (
        "begin_quorum_epoch_response",
        codec.begin_response_to_pb(m.BeginQuorumEpochResponse(ErrorCode.NONE, "", 1, 9)),
        "18012009",
    ),
    (
        "end_quorum_epoch_request",
        codec.end_request_to_pb(m.EndQuorumEpochRequest("cluster-a", 1, 9, 3, (3, 2))),
        "0a09636c75737465722d611001180920032a020302",
    ),
    (
        "end_quorum_epoch_response",
        codec.end_response_to_pb(m.EndQuorumEpochResponse(ErrorCode.NOT_LEADER_OR_FOLLOWER, "x", -1, 9)),
        "080612017818ffffffffffffffffff012009",
    ),
    (
        "fetch_request",
        codec.fetch_request_to_pb(m.FetchRequest("cluster-a", 2, 9, 4096, 8, 500, 1048576, "dir-2")),
        "0a09636c75737465722d6110021809208020280830f4033880804042056469722d32",
    ),
    (
        # read_round (field 9) added for leadership confirmation; 0 is not on the wire, so the encoding
        # above, which older peers send, is unchanged.
        "fetch_request_with_read_round",
        codec.fetch_request_to_pb(m.FetchRequest("cluster-a", 2, 9, 4096, 8, 500, 1048576, "dir-2", 300)),
        "0a09636c75737465722d6110021809208020280830f4033880804042056469722d3248ac02",
    ),
    (
        "fetch_response_with_read_round",
        codec.fetch_response_to_pb(m.FetchResponse(ErrorCode.NONE, "", 1, 9, 4000, 100, read_round=300)),
        "1801200928a01f306450ac02",
    ),
    (
        "fetch_response",
        codec.fetch_response_to_pb(
            m.FetchResponse(
                ErrorCode.NONE,
                "",
                1,
                9,
                4000,
                100,
                b"\x00\x01batch",
                m.EpochEndOffset(0, 0),
                m.SnapshotId(0, 0),
            )
        ),
        "1801200928a01f30643a070001626174636842004a00",
    ),
    (
        "fetch_snapshot_request",
        codec.fetch_snapshot_request_to_pb(
            m.FetchSnapshotRequest("cluster-a", 2, 9, m.SnapshotId(300, 4), 65536, 1048576)
        ),
        "0a09636c75737465722d6110021809220508ac0210042880800430808040",
    ),
    (
        "fetch_snapshot_response",
        codec.fetch_snapshot_response_to_pb(
            m.FetchSnapshotResponse(ErrorCode.NONE, "", 1, 9, m.SnapshotId(300, 4), 200000, 65536, b"chunk")
        ),
        "180120092a0508ac02100430c09a0c3880800442056368756e6b",
    ),
    (
        "describe_quorum_request",
        codec.describe_request_to_pb(m.DescribeQuorumRequest("cluster-a")),
        "0a09636c75737465722d61",
    ),
    (
        "describe_quorum_response",
        codec.describe_response_to_pb(
            m.DescribeQuorumResponse(
                ErrorCode.NONE, "", 1, 9, 4000, _REPLICAS, (m.ReplicaState(7, 0, -1, -1, "dir-7"),)
            ),
        ),
        "1801200928a01f321a080110a01f1880d095ffbc312080d095ffbc312a056469722d313217080210961f1881d095ffbc3120"
        "ffffffffffffffffff013a1f080718ffffffffffffffffff0120ffffffffffffffffff012a056469722d37",
    ),
]


@pytest.mark.parametrize(
    ("encoded", "golden_hex"), [(e, g) for _, e, g in _GOLDEN], ids=[n for n, _, _ in _GOLDEN]
)
def test_encoding_is_byte_identical_to_the_pinned_wire_format(encoded: Any, golden_hex: str) -> None:
    assert encoded.SerializeToString().hex() == golden_hex


# --- schema drift: the .proto and messages.py describe the same fields ---

# Protobuf fields that have no dataclass counterpart on purpose: the transport adds them, the core never
# sees them.
_PROTOBUF_ONLY_FIELDS = {
    raft_pb2.DescribeQuorumResponse: {"cluster_id", "nodes", "responder_id", "peer_problems"},
}
_PAIRS = [
    (m.SnapshotId, raft_pb2.SnapshotId),
    (m.EpochEndOffset, raft_pb2.EpochEndOffset),
    (m.VoteRequest, raft_pb2.VoteRequest),
    (m.VoteResponse, raft_pb2.VoteResponse),
    (m.BeginQuorumEpochRequest, raft_pb2.BeginQuorumEpochRequest),
    (m.BeginQuorumEpochResponse, raft_pb2.BeginQuorumEpochResponse),
    (m.EndQuorumEpochRequest, raft_pb2.EndQuorumEpochRequest),
    (m.EndQuorumEpochResponse, raft_pb2.EndQuorumEpochResponse),
    (m.FetchRequest, raft_pb2.FetchRequest),
    (m.FetchResponse, raft_pb2.FetchResponse),
    (m.FetchSnapshotRequest, raft_pb2.FetchSnapshotRequest),
    (m.FetchSnapshotResponse, raft_pb2.FetchSnapshotResponse),
    (m.ReplicaState, raft_pb2.ReplicaState),
    (m.DescribeQuorumRequest, raft_pb2.DescribeQuorumRequest),
    (m.DescribeQuorumResponse, raft_pb2.DescribeQuorumResponse),
]


@pytest.mark.parametrize(("dataclass_type", "pb_type"), _PAIRS, ids=[d.__name__ for d, _ in _PAIRS])
def test_dataclass_and_protobuf_message_have_the_same_fields(dataclass_type: Any, pb_type: Any) -> None:
    dataclass_fields = {f.name for f in dataclasses.fields(dataclass_type)}
    pb_fields = set(pb_type.DESCRIPTOR.fields_by_name) - _PROTOBUF_ONLY_FIELDS.get(pb_type, set())
    assert dataclass_fields == pb_fields


def test_a_codec_for_mismatched_messages_fails_at_import_time() -> None:
    with pytest.raises(TypeError, match="fetch_offset"):
        codec._MessageCodec(m.FetchRequest, raft_pb2.VoteRequest)
    with pytest.raises(TypeError, match="no_such_field"):
        codec._MessageCodec(m.VoteRequest, raft_pb2.VoteRequest, no_such_field=codec._ERROR_CODE)
