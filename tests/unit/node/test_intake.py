"""The request plane (kraft/node/intake.py): a grpc.aio server on an intake thread whose handlers run on
the main loop — unary, streaming both ways, context.write (the health Watch shape), abort with its status,
and a cancelled call cancelling its handler on the main loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from kraft.netutil import free_port
from kraft.node.intake import HopInterceptor, IntakeLoop

SERVICE = "test.Intake"


class Handlers:
    def __init__(self) -> None:
        self.threads: list[int] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.threads.append(threading.get_ident())
        await asyncio.sleep(0)  # awaits on the main loop work
        return b"echo:" + request

    async def refuse(self, request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad {request.decode()}")
        raise AssertionError("unreachable")

    async def hang(self, request: bytes, context: Any) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def watch(self, request: bytes, context: Any) -> None:
        for i in range(3):
            await context.write(b"w%d" % i)

    async def doubled(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            self.threads.append(threading.get_ident())
            yield request * 2


def _raw(value: bytes) -> bytes:
    return value


def _server(handlers: Handlers, port: int, interceptors: list[Any]) -> grpc.aio.Server:
    server = grpc.aio.server(interceptors=interceptors)
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(handlers.echo),
        "Refuse": grpc.unary_unary_rpc_method_handler(handlers.refuse),
        "Hang": grpc.unary_unary_rpc_method_handler(handlers.hang),
        "Watch": grpc.unary_stream_rpc_method_handler(handlers.watch),
        "Doubled": grpc.stream_stream_rpc_method_handler(handlers.doubled),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    return server


async def test_handlers_run_on_the_main_loop_and_answer_through_the_intake_thread() -> None:
    handlers = Handlers()
    port = free_port()
    intake = IntakeLoop(name="test-intake")
    intake.start()
    hop = HopInterceptor(asyncio.get_running_loop(), intake.loop)

    async def start() -> grpc.aio.Server:
        server = _server(handlers, port, [hop])
        await server.start()
        return server

    server = await intake.run(start())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary(f"/{SERVICE}/Echo", _raw, _raw)
            assert await echo(b"hi", timeout=5) == b"echo:hi"
            assert handlers.threads == [threading.get_ident()]  # ran on this (the main) loop's thread

            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary(f"/{SERVICE}/Refuse", _raw, _raw)(b"input", timeout=5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == "bad input"

            watched = [m async for m in channel.unary_stream(f"/{SERVICE}/Watch", _raw, _raw)(b"", timeout=5)]
            assert watched == [b"w0", b"w1", b"w2"]

            call = channel.stream_stream(f"/{SERVICE}/Doubled", _raw, _raw)(None, timeout=5)
            for request in (b"a", b"bc"):
                await call.write(request)
                assert await call.read() == request * 2
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF  # type: ignore[attr-defined]

            with pytest.raises(grpc.aio.AioRpcError) as expired:
                await channel.unary_unary(f"/{SERVICE}/Hang", _raw, _raw)(b"", timeout=0.3)
            assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(handlers.cancelled.wait(), 5)  # the handler's task was cancelled too
    finally:
        await intake.run(server.stop(grace=0))
        intake.close()
    assert not intake.loop.is_running()
