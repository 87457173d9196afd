"""The MetadataFetcher carries the voter set from the controllers' answers to the broker's ControllerClient
(KIP-853): each fetch names the version it holds, a newer set in an answer becomes the client's rotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker_fakes import MemoryImageStore, started_publisher

from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.client.controller import NO_VOTER_SET, ControllerClient
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb
from kraft.v1.common_pb2 import Endpoint

ME = 4


class VotersController:
    """Answers MetadataFetch with no records; sends ``voters`` when the request's known_voters is older."""

    def __init__(self) -> None:
        self.active_controller_id = 1
        self.requests: list[cpb.MetadataFetchRequest] = []
        self.voters = cpb.QuorumVoters(version=cpb.VoterSetVersion(leader_epoch=7, offset=42))
        for node_id in (1, 2, 3):
            self.voters.voters.add(
                node_id=node_id, endpoints=[Endpoint(name="CONTROLLER", host=f"10.0.0.{node_id}", port=9000)]
            )

    async def call(
        self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        self.requests.append(cpb.MetadataFetchRequest.FromString(request.SerializeToString()))
        response = cpb.MetadataFetchResponse(error_code=ErrorCode.NONE, high_watermark=0)
        version = self.voters.version
        if request.HasField("known_voters") and (version.leader_epoch, version.offset) > (
            request.known_voters.leader_epoch,
            request.known_voters.offset,
        ):
            response.voters.CopyFrom(self.voters)
        return response


def fetcher_for(
    controller: VotersController, publisher: Any, clock: ManualClock, voters: ControllerClient | None
) -> MetadataFetcher:
    return MetadataFetcher(
        ME,
        "c",
        controller,  # type: ignore[arg-type]
        publisher,
        FetcherTimings(max_wait_ms=0, request_timeout_s=1.0),
        lambda offset: None,
        clock=clock,
        voters=voters,
    )


async def test_the_voter_set_in_a_fetch_answer_becomes_the_clients_rotation(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    controller = VotersController()
    client = ControllerClient([(-2, "boot:9093")], listener_names=["CONTROLLER"])
    fetcher = fetcher_for(controller, publisher, clock, client)
    try:
        assert await fetcher.fetch_once()
        first = controller.requests[0].known_voters
        assert controller.requests[0].HasField("known_voters")
        assert (first.leader_epoch, first.offset) == NO_VOTER_SET
        assert client.voter_set_version == (7, 42)
        assert client.rotation == [
            (1, "10.0.0.1:9000"),
            (2, "10.0.0.2:9000"),
            (3, "10.0.0.3:9000"),
            (-2, "boot:9093"),
        ]
        assert await fetcher.fetch_once()  # the next fetch names the set it holds
        second = controller.requests[1].known_voters
        assert (second.leader_epoch, second.offset) == (7, 42)
    finally:
        await publisher.flush()
        manager.close()


async def test_a_fetcher_without_a_voter_sink_asks_for_no_voter_set(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    controller = VotersController()
    fetcher = fetcher_for(controller, publisher, clock, None)
    try:
        assert await fetcher.fetch_once()
        assert not controller.requests[0].HasField("known_voters")
    finally:
        await publisher.flush()
        manager.close()
