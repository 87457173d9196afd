"""The transport edge's mapping from error codes to gRPC statuses."""

from __future__ import annotations

import grpc

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for


def test_no_error_maps_to_ok() -> None:
    assert grpc_status_for(ErrorCode.NONE) is grpc.StatusCode.OK


def test_validation_errors_without_an_entry_map_to_invalid_argument() -> None:
    for code in (ErrorCode.INVALID_CONFIG, ErrorCode.POLICY_VIOLATION, ErrorCode.MESSAGE_TOO_LARGE):
        assert grpc_status_for(code) is grpc.StatusCode.INVALID_ARGUMENT


def test_leadership_errors_map_to_failed_precondition() -> None:
    for code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_CONTROLLER, ErrorCode.FENCED_LEADER_EPOCH):
        assert grpc_status_for(code) is grpc.StatusCode.FAILED_PRECONDITION


def test_the_statuses_servicers_abort_with() -> None:
    # The two aborts servicers make; their statuses are what clients already retry on.
    assert grpc_status_for(ErrorCode.BROKER_NOT_AVAILABLE) is grpc.StatusCode.UNAVAILABLE
    assert grpc_status_for(ErrorCode.UNKNOWN_SERVER_ERROR) is grpc.StatusCode.INTERNAL


def test_authorization_failures_map_to_permission_denied() -> None:
    # The authorizer's refusals (kraft.security.guard); ControllerClient raises them without retrying.
    for code in (
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ):
        assert grpc_status_for(code) is grpc.StatusCode.PERMISSION_DENIED
    assert (ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED) == (29, 31)
