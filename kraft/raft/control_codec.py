"""The voter set as Kafka's control records (KIP-853): :class:`~kraft.raft.voters.VoterSet` ↔
``KRaftVersionRecord`` / ``VotersRecord`` (:mod:`kraft.storage.control`), in log batches and snapshots.

An edge module (it reads the byte format): the driver, the snapshot stores and offline tools use it; the
core only ever sees the decoded :class:`~kraft.raft.voters.VoterSet` through its injected batch scanner.
"""

from __future__ import annotations

from kraft.raft.voters import Endpoint, Voter, VoterSet
from kraft.storage.batch import RecordBatch, iter_batches
from kraft.storage.control import KRaftVersionRecord, VoterEndpoint, VoterRecordEntry, VotersRecord
from kraft.storage.ids import is_valid_uuid

MAX_ENDPOINTS = 16
MAX_ENDPOINT_TEXT = 255

KRAFT_VERSION_DYNAMIC = 1
"""kraft.version 1: the voter set lives in the log (0 is the static ``controller.quorum.voters``)."""


def voter_problem(node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...] = ()) -> str | None:
    """Why a voter named by an operator (AddRaftVoter, ...) cannot go into a VotersRecord, or None —
    checked where the request enters, before anything is appended."""
    if not 0 <= node_id < 1 << 31:
        return f"voter id {node_id} is not a non-negative int32"
    if not is_valid_uuid(directory_id):
        return f"directory id {directory_id!r} is not a 22-character base64url UUID"
    if len(endpoints) > MAX_ENDPOINTS:
        return f"at most {MAX_ENDPOINTS} endpoints"
    for endpoint in endpoints:
        if not endpoint.name or not endpoint.host:
            return "an endpoint needs a listener name and a host"
        if max(len(endpoint.name), len(endpoint.host)) > MAX_ENDPOINT_TEXT:
            return f"endpoint names and hosts are at most {MAX_ENDPOINT_TEXT} characters"
        if not 0 < endpoint.port < 65536:
            return f"port {endpoint.port} is not in 1-65535"
    return None


def voters_record_of(voters: VoterSet) -> VotersRecord:
    return VotersRecord(
        tuple(
            VoterRecordEntry(
                voter.node_id,
                voter.directory_id,
                tuple(VoterEndpoint(e.name, e.host, e.port) for e in voter.endpoints),
            )
            for voter in voters
        )
    )


def voter_set_of(record: VotersRecord) -> VoterSet:
    """The voter set of a VotersRecord (``VoterSetError`` — a ``ValueError`` — for an invalid one)."""
    return VoterSet(
        tuple(
            Voter(
                entry.voter_id,
                entry.directory_id,
                tuple(Endpoint(e.name, e.host, e.port) for e in entry.endpoints),
            )
            for entry in record.voters
        )
    )


def voter_control_messages(voters: VoterSet) -> list[KRaftVersionRecord | VotersRecord]:
    """What a snapshot (or the bootstrap checkpoint) holds after its header: kraft.version, then voters."""
    return [KRaftVersionRecord(KRAFT_VERSION_DYNAMIC), voters_record_of(voters)]


def voters_in_batch(batch: RecordBatch) -> VoterSet | None:
    """The last VotersRecord of a control batch, as a voter set."""
    found: VoterSet | None = None
    for message in batch.control_messages():
        if isinstance(message, VotersRecord):
            found = voter_set_of(message)
    return found


def voters_in_snapshot(data: bytes) -> VoterSet | None:
    """The voter set a snapshot file holds (None: a static quorum's snapshot)."""
    found: VoterSet | None = None
    for batch in iter_batches(data):
        if batch.is_control:
            found = voters_in_batch(batch) or found
    return found
