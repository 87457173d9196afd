"""The controller client bounds gRPC's reconnect backoff, so a controller back from the dead is reachable
again within about a second.

With gRPC's default reconnect backoff a kept channel stayed in TRANSIENT_FAILURE for 3-4 s after a
controller that had been down ~6 s was back; if that controller had just become active, it fenced the
broker for a missed session meanwhile.  The end-to-end check (6 s of real sockets and gRPC's own reconnect
timers) is tests/integration/test_controller_client_reconnect.py.

``grpc.min_reconnect_backoff_ms`` is gRPC core's minimum time for one connection attempt, not a backoff: at
100 ms a handshake slower than that (a loaded host) failed the call at once.
"""

from __future__ import annotations

from slow_handshake import slow_first_answer
from test_heartbeat_stream import StandIn

from kraft.client.controller import ControllerClient
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb


def test_the_default_client_options_bound_the_reconnect_backoff() -> None:
    options = dict(ControllerClient([(1, "127.0.0.1:1")])._options)
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    assert options["grpc.initial_reconnect_backoff_ms"] <= options["grpc.max_reconnect_backoff_ms"]


async def test_a_controller_whose_handshake_answer_takes_300_ms_is_reached_on_the_first_call() -> None:
    # gRPC core gives one connection attempt grpc.min_reconnect_backoff_ms (TCP and HTTP/2 SETTINGS); at
    # 100 ms a loaded host's handshake failed the call at once with UNAVAILABLE, and the client's
    # attempts on the channel then in backoff failed as fast.
    active = StandIn(1)
    await active.start()
    try:
        async with slow_first_answer(active.port, delay_s=0.3) as port:
            client = ControllerClient([(1, f"127.0.0.1:{port}")])
            try:
                beat = cpb.BrokerHeartbeatRequest(cluster_id="c", broker_id=101, broker_epoch=3)
                answer = await client.call(lambda stub: stub.BrokerHeartbeat, beat, 5.0)
            finally:
                await client.close()
        assert answer.error_code == ErrorCode.NONE and active.unary_calls == 1
    finally:
        assert active.server is not None
        await active.server.stop(None)
