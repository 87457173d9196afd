"""The one error vocabulary of kraft.

Every gRPC response carries an ``error_code`` from :class:`ErrorCode` (Kafka's names and numbers where
Kafka has one) and an ``error_message``. This module is pure (no grpc, no IO) so that the IO-free Raft
core and its messages can use it; the mapping from an error code to a gRPC status lives at the transport
edge, in :mod:`kraft.grpc_errors`.

Two controller answers tell a client whether it may resend a write (docs/internals/node-and-client.md):

* ``NOT_CONTROLLER`` — *nothing was done*: this controller is not the active one (``controller`` names the
  one it believes is, node id -1 when none is known).  Any request may be sent again, to that controller.
* ``REQUEST_TIMED_OUT`` — *outcome unknown*: the write was appended to the metadata log and then did not
  commit in time, or leadership was lost before it committed (then ``controller`` names the new
  active controller).  Its records may still commit, or be truncated.  Only idempotent requests
  (heartbeats, registrations, reads, elections, controlled shutdown) may be resent as they are; a
  CreateTopics/DeleteTopics/UnregisterBroker resend is reconciled by :class:`kraft.client.admin.AdminClient`
  (e.g. TOPIC_ALREADY_EXISTS with the requested spec after an unknown outcome is the client's own create).

Kafka's controller answers both cases NOT_CONTROLLER; kraft keeps them apart so that a retried create
never reports TOPIC_ALREADY_EXISTS for the topic it created itself.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    MESSAGE_TOO_LARGE = 10
    KAFKA_STORAGE_ERROR = 56
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78
    STALE_BROKER_EPOCH = 77
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    INCONSISTENT_VOTER_SET = 94
    INVALID_UPDATE_VERSION = 95
    SNAPSHOT_NOT_FOUND = 98
    POSITION_OUT_OF_RANGE = 99
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_CLUSTER_ID = 104
    INELIGIBLE_REPLICA = 107
    INVALID_REGISTRATION = 119
    INVALID_VOTER_KEY = 125
    DUPLICATE_VOTER = 126
    VOTER_NOT_FOUND = 127
    UNKNOWN_SERVER_ERROR = -1

    @classmethod
    def from_wire(cls, value: int) -> ErrorCode:
        """Decode a wire value; a code this build does not know becomes UNKNOWN_SERVER_ERROR."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


# Kafka spells this one INVALID_TOPIC in the protocol guide; keep both names resolvable.
INVALID_TOPIC = ErrorCode.INVALID_TOPIC_EXCEPTION


class KraftError(Exception):
    """An error that carries an :class:`ErrorCode`; raised inside, turned into a response at the edge."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message or code.name
