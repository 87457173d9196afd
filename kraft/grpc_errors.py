"""The transport edge of the error vocabulary: :class:`~kraft.errors.ErrorCode` → gRPC status.

Transport-level failures (a request that could not be parsed, a deadline, an unavailable peer) are gRPC
statuses; :func:`grpc_status_for` is the single mapping from an error code to the status a handler
aborts with when it cannot answer with a normal response.  Every servicer abort goes through it
(RaftService, the Raft test service, ControllerService): BROKER_NOT_AVAILABLE → UNAVAILABLE while the
Raft node shuts down, UNKNOWN_SERVER_ERROR → INTERNAL for an unexpected exception.  Errors a client can
act on travel as ``error_code`` in a normal response instead; BrokerService never aborts.

It lives apart from :mod:`kraft.errors` so that importing the error codes never loads grpc.
"""

from __future__ import annotations

import grpc

from kraft.errors import ErrorCode

_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.NONE: grpc.StatusCode.OK,
    ErrorCode.OFFSET_OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    ErrorCode.POSITION_OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    ErrorCode.CORRUPT_MESSAGE: grpc.StatusCode.DATA_LOSS,
    ErrorCode.KAFKA_STORAGE_ERROR: grpc.StatusCode.INTERNAL,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: grpc.StatusCode.NOT_FOUND,
    ErrorCode.SNAPSHOT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.BROKER_ID_NOT_REGISTERED: grpc.StatusCode.NOT_FOUND,
    ErrorCode.VOTER_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.TOPIC_ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.DUPLICATE_BROKER_REGISTRATION: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.DUPLICATE_VOTER: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.REQUEST_TIMED_OUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.BROKER_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.LEADER_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.OFFSET_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.NOT_CONTROLLER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.FENCED_LEADER_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.UNKNOWN_LEADER_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.STALE_BROKER_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.INCONSISTENT_CLUSTER_ID: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.INCONSISTENT_VOTER_SET: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.ELECTION_NOT_NEEDED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.UNSUPPORTED_VERSION: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNKNOWN_SERVER_ERROR: grpc.StatusCode.INTERNAL,
}


def grpc_status_for(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status a handler uses when an error cannot be carried in a normal response.

    Validation errors (INVALID_*, MESSAGE_TOO_LARGE, POLICY_VIOLATION, …) map to INVALID_ARGUMENT.
    """
    return _STATUS.get(code, grpc.StatusCode.INVALID_ARGUMENT)
