"""The one place kraft opens gRPC channels to its own services (controllers, brokers, Raft peers).

Plaintext today.  Transport security (issue #11) goes here and nowhere else: these two functions then
build ``grpc.ssl_channel_credentials`` from the client's configuration and call ``secure_channel``, and
every client — brokers, the CLI, the chaos harness, benchmarks, tests and the Raft transport — follows.

This module imports nothing else of kraft, so any layer may use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

ChannelOptions = Sequence[tuple[str, Any]]
"""gRPC channel arguments, e.g. ``[("grpc.max_receive_message_length", n)]``."""


def open_channel(target: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (``host:port``); close it with ``await channel.close()``."""
    return grpc.aio.insecure_channel(target, options=list(options))


def open_blocking_channel(target: str, options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to ``target`` for callers without an event loop (CLI probes, harnesses)."""
    return grpc.insecure_channel(target, options=list(options))
