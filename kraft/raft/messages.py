"""Every Raft message kraft exchanges between controllers, as frozen slotted dataclasses.

These are the *internal* shape of KIP-595/KIP-996 RPCs; the gRPC transport maps each one 1:1 to a
``kraft.v1`` protobuf message (same field names).  Conventions:

- every request carries ``cluster_id``; every response carries ``error_code`` (:class:`ErrorCode`) and
  ``error_message``;
- every response carries the responder's view of the current leader as ``leader_id`` / ``leader_epoch``
  (Kafka's ``CurrentLeader``; ``leader_id == -1`` when unknown) so a node can learn a newer epoch from any
  answer;
- offsets are absolute log offsets, ``end_offset`` means "one past the last record";
- ``records`` / ``unaligned_records`` are raw bytes: whole encoded record batches (Kafka v2 framing,
  ``kraft.storage.batch``) for Fetch, an arbitrary byte range of the snapshot file for FetchSnapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kraft.errors import ErrorCode

NO_LEADER = -1
"""``leader_id`` / ``voted_id`` value meaning "none known"."""

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1

EPOCH_HEADROOM = 1 << 20
"""Epochs kept free below the wire limit: a leader epoch is an int32 on the wire and in every batch
header, and a candidate sends ``epoch + 1``, so a node must never hold an epoch it cannot bump and encode.
One legitimate election moves the epoch by one; 2^20 spare elections are decades of churn."""

MAX_EPOCH = INT32_MAX - EPOCH_HEADROOM
"""The highest epoch a node accepts from a peer or from its quorum-state file (issue #15: one forged
``2^31 - 1`` epoch used to be persisted and make every later send fail with ``Value out of range``)."""

MAX_OFFSET = INT64_MAX
"""Offsets are int64 on the wire; anything outside ``[0, MAX_OFFSET]`` is refused, never clamped."""


@dataclass(frozen=True, slots=True)
class SnapshotId:
    """A snapshot holds every record below ``end_offset``; ``epoch`` is the epoch of its last record."""

    end_offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """Where a leader's log for ``epoch`` ends (DivergingEpoch in a Fetch response)."""

    epoch: int
    end_offset: int


# --- Vote (KIP-595, PreVote from KIP-996) ---


@dataclass(frozen=True, slots=True)
class VoteRequest:
    cluster_id: str
    candidate_epoch: int
    """The epoch the candidate is running for (already bumped; for a pre-vote: its current epoch + 1)."""
    candidate_id: int
    voter_id: int
    """The intended receiver, so a misrouted request is detected."""
    last_offset_epoch: int
    last_offset: int
    """The candidate's log end offset."""
    pre_vote: bool = False
    candidate_directory_id: str = ""
    """The candidate's metadata ``directory.id`` (KIP-853; "" when unknown)."""
    voter_directory_id: str = ""
    """The directory id the candidate believes the receiver has: a receiver with another one (its disk
    was wiped) refuses with INVALID_VOTER_KEY; "" matches any."""


@dataclass(frozen=True, slots=True)
class VoteResponse:
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int
    vote_granted: bool
    pre_vote: bool = False


# --- BeginQuorumEpoch / EndQuorumEpoch ---


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    cluster_id: str
    leader_id: int
    leader_epoch: int
    voter_id: int
    voter_directory_id: str = ""
    """The receiver's directory id in the leader's voter set ("" matches any), as in Vote."""


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    cluster_id: str
    leader_id: int
    leader_epoch: int
    voter_id: int
    preferred_successors: tuple[int, ...] = ()
    """Voters ordered by descending fetch offset; position decides each one's election backoff."""


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int


# --- Fetch (pull-based replication) ---


@dataclass(frozen=True, slots=True)
class FetchRequest:
    cluster_id: str
    replica_id: int
    """The fetching node (voter or observer)."""
    current_leader_epoch: int
    fetch_offset: int
    """The fetcher's log end offset."""
    last_fetched_epoch: int
    """Epoch of the fetcher's last record (or of its latest snapshot when its log is empty)."""
    max_wait_ms: int = 500
    max_bytes: int = 8 * 1024 * 1024
    replica_directory_id: str = ""
    """The fetcher's metadata ``directory.id``: a voter counts toward the high watermark only with the
    directory id it was added with (KIP-853); "" when unknown."""
    read_round: int = 0
    """The highest ``FetchResponse.read_round`` this fetcher got from the leader of
    ``current_leader_epoch`` (0: none): the echo that confirms the leader's leadership rounds."""
    echo_only: bool = False
    """Only the read-round echo (``FetcherRole`` sends it while a fetched batch is still being appended
    and flushed): the leader records the echo, answers at once without records and does not take
    ``fetch_offset`` as progress."""
    high_watermark: int | None = None
    """The high watermark the fetcher knows (KIP-1166): the leader answers a fetcher that could learn a
    higher one soon (``RaftConfig.fetch_high_watermark_wait_ms``), not at the long poll's end.  None: a
    fetcher that does not say (an older version, an echo, a discovery fetch)."""


@dataclass(frozen=True, slots=True)
class FetchResponse:
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int
    high_watermark: int = -1
    log_start_offset: int = 0
    records: bytes = b""
    diverging_epoch: EpochEndOffset | None = None
    """Set when the fetcher's log diverged: truncate to at most ``end_offset`` and fetch again."""
    snapshot_id: SnapshotId | None = None
    """Set when the fetcher is below the leader's log start: download this snapshot first."""
    read_round: int = 0
    """The leader's latest started leadership-confirmation round (0: none), for the fetcher to echo."""


# --- FetchSnapshot (KIP-630) ---


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    cluster_id: str
    replica_id: int
    current_leader_epoch: int
    snapshot_id: SnapshotId
    position: int
    """Byte position in the snapshot file."""
    max_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int
    snapshot_id: SnapshotId | None = None
    size: int = 0
    """Total size of the snapshot file in bytes."""
    position: int = 0
    unaligned_records: bytes = b""


# --- DescribeQuorum ---


@dataclass(frozen=True, slots=True)
class ReplicaState:
    replica_id: int
    log_end_offset: int
    last_fetch_timestamp_ms: int
    """-1 when the replica never fetched."""
    last_caught_up_timestamp_ms: int
    """Last time the replica's fetch reached the leader's end offset as of that time; -1 if never."""
    directory_id: str = ""
    """The replica's directory id ("" when unknown: a static voter that never fetched)."""


@dataclass(frozen=True, slots=True)
class DescribeQuorumRequest:
    cluster_id: str


@dataclass(frozen=True, slots=True)
class DescribeQuorumResponse:
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int
    high_watermark: int = -1
    current_voters: tuple[ReplicaState, ...] = field(default_factory=tuple)
    observers: tuple[ReplicaState, ...] = field(default_factory=tuple)


RaftRequest = (
    VoteRequest
    | BeginQuorumEpochRequest
    | EndQuorumEpochRequest
    | FetchRequest
    | FetchSnapshotRequest
    | DescribeQuorumRequest
)
RaftResponse = (
    VoteResponse
    | BeginQuorumEpochResponse
    | EndQuorumEpochResponse
    | FetchResponse
    | FetchSnapshotResponse
    | DescribeQuorumResponse
)


def error_response_for(
    request: RaftRequest, code: ErrorCode, message: str, leader_id: int, leader_epoch: int
) -> RaftResponse:
    """The response type matching ``request``, carrying only an error and the current leader."""
    if isinstance(request, VoteRequest):
        return VoteResponse(code, message, leader_id, leader_epoch, False, request.pre_vote)
    if isinstance(request, BeginQuorumEpochRequest):
        return BeginQuorumEpochResponse(code, message, leader_id, leader_epoch)
    if isinstance(request, EndQuorumEpochRequest):
        return EndQuorumEpochResponse(code, message, leader_id, leader_epoch)
    if isinstance(request, FetchRequest):
        return FetchResponse(code, message, leader_id, leader_epoch)
    if isinstance(request, FetchSnapshotRequest):
        return FetchSnapshotResponse(code, message, leader_id, leader_epoch)
    return DescribeQuorumResponse(code, message, leader_id, leader_epoch)
