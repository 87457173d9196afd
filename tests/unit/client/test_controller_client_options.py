"""The controller client bounds gRPC's reconnect backoff, so a controller back from the dead is reachable
again within about a second.

With gRPC's default reconnect backoff a kept channel stayed in TRANSIENT_FAILURE for 3-4 s after a
controller that had been down ~6 s was back; if that controller had just become active, it fenced the
broker for a missed session meanwhile.  The end-to-end check (6 s of real sockets and gRPC's own reconnect
timers) is tests/integration/test_controller_client_reconnect.py.
"""

from __future__ import annotations

from kraft.client.controller import ControllerClient


def test_the_default_client_options_bound_the_reconnect_backoff() -> None:
    options = dict(ControllerClient([(1, "127.0.0.1:1")])._options)
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    assert options["grpc.initial_reconnect_backoff_ms"] <= options["grpc.max_reconnect_backoff_ms"]
