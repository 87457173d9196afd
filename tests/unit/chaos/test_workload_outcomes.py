"""How the topic workload turns controller answers into ok / fail / info (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.history import EventType, HistoryStore
from chaos.workload import TopicWorkload
from kraft.errors import ErrorCode
from kraft.v1 import common_pb2, controller_pb2


@pytest.fixture
async def workload(tmp_path: Path) -> TopicWorkload:
    store = await HistoryStore.create(tmp_path / "history.sqlite")
    await store.close()
    return TopicWorkload(store, "cid", {1: "127.0.0.1:1", 2: "127.0.0.1:2"}, seed=1, initial_leader=1)


def _create(code: ErrorCode, top: ErrorCode = ErrorCode.NONE) -> controller_pb2.CreateTopicsResponse:
    return controller_pb2.CreateTopicsResponse(
        error_code=int(top),
        controller=common_pb2.NodeRef(node_id=2),
        topics=[controller_pb2.CreatableTopicResult(name="t", error_code=int(code))],
    )


def _delete(code: ErrorCode) -> controller_pb2.DeleteTopicsResponse:
    return controller_pb2.DeleteTopicsResponse(
        topics=[controller_pb2.DeletableTopicResult(name="t", error_code=int(code))]
    )


@pytest.mark.parametrize(
    ("f", "response", "outcome", "result"),
    [
        ("create", _create(ErrorCode.NONE), EventType.OK, "created"),
        ("create", _create(ErrorCode.TOPIC_ALREADY_EXISTS), EventType.OK, "exists"),
        ("create", _create(ErrorCode.INVALID_REPLICATION_FACTOR), EventType.FAIL, None),
        ("create", _create(ErrorCode.NONE, top=ErrorCode.NOT_CONTROLLER), EventType.INFO, None),
        ("create", _create(ErrorCode.NONE, top=ErrorCode.REQUEST_TIMED_OUT), EventType.INFO, None),
        ("create", _create(ErrorCode.REQUEST_TIMED_OUT), EventType.INFO, None),
        ("delete", _delete(ErrorCode.NONE), EventType.OK, "deleted"),
        ("delete", _delete(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), EventType.OK, "not_found"),
    ],
)
def test_outcome_rules(
    workload: TopicWorkload, f: str, response: object, outcome: EventType, result: object
) -> None:
    completion = workload.interpret(f, 1, response)
    assert completion.outcome is outcome
    assert completion.result == result


def test_not_controller_hint_moves_the_client_to_the_named_node(workload: TopicWorkload) -> None:
    workload.interpret("create", 1, _create(ErrorCode.NONE, top=ErrorCode.NOT_CONTROLLER))
    assert workload.pick_controller() == 2


def test_reads_report_presence(workload: TopicWorkload) -> None:
    present = controller_pb2.DescribeTopicsResponse(topics=[controller_pb2.TopicDescription(name="t")])
    absent = controller_pb2.DescribeTopicsResponse(
        topics=[
            controller_pb2.TopicDescription(name="t", error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
        ]
    )
    assert workload.interpret("read", 1, present).result is True
    assert workload.interpret("read", 1, absent).result is False
