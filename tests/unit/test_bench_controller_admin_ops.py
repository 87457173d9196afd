"""bench.controller's admin workers create topics the way an operator's client does: a CreateTopics resent
after an unknown outcome is reconciled (``AdminClient.create_topics``), so the first attempt's own topic
answering TOPIC_ALREADY_EXISTS does not end the benchmark run (it did once, session 16)."""

from __future__ import annotations

from typing import Any

from bench.controller import admin_ops
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb


class ReconcilingClient:
    """Answers CreateTopics as AdminClient does after a resend whose first attempt committed: through
    ``create_topics`` the topic counts as created; a bare ``call`` sees TOPIC_ALREADY_EXISTS."""

    def __init__(self) -> None:
        self.created: list[str] = []

    async def create_topics(self, request: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        self.created.extend(t.name for t in request.topics)
        return cpb.CreateTopicsResponse(
            topics=[cpb.CreatableTopicResult(name=t.name, error_code=ErrorCode.NONE) for t in request.topics]
        )

    async def call(self, pick: Any, request: cpb.CreateTopicsRequest, check: bool = True) -> Any:
        return cpb.CreateTopicsResponse(
            topics=[
                cpb.CreatableTopicResult(
                    name=t.name, error_code=ErrorCode.TOPIC_ALREADY_EXISTS, error_message="exists"
                )
                for t in request.topics
            ]
        )


async def test_admin_ops_creates_through_the_reconciling_create_topics() -> None:
    client = ReconcilingClient()
    result = await admin_ops(client, seconds=0.05, workers=2, prefix="t")  # type: ignore[arg-type]
    assert result["ops"] >= 1
    assert len(client.created) == result["ops"]
    assert all(name.startswith("t-") for name in client.created)
