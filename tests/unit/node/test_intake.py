"""The request plane (kraft/node/intake.py): a grpc.aio server on an intake thread whose handlers run on
the main loop — unary, streaming both ways, context.write (the health Watch shape), abort with its status,
and a cancelled call cancelling its handler on the main loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import warnings
from collections.abc import AsyncIterator
from types import SimpleNamespace
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
        self.seen_peer = ""
        self.seen_auth: dict[str, list[bytes]] = {}

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

    async def status(self, request: bytes, context: Any) -> bytes:
        # What handlers do with the context besides abort: read who called, set a status and answer.
        self.seen_peer = context.peer()
        self.seen_auth = context.auth_context()
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details(f"not now: {request.decode()}")
        return b""

    async def watch(self, request: bytes, context: Any) -> None:
        for i in range(3):
            await context.write(b"w%d" % i)

    async def doubled(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            self.threads.append(threading.get_ident())
            yield request * 2


def _details(method: str) -> Any:
    """What grpc.aio hands an interceptor for a call of ``method``."""
    return SimpleNamespace(method=method, invocation_metadata=())


def _raw(value: bytes) -> bytes:
    return value


def _server(handlers: Handlers, port: int, interceptors: list[Any]) -> grpc.aio.Server:
    server = grpc.aio.server(interceptors=interceptors)
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(handlers.echo),
        "Refuse": grpc.unary_unary_rpc_method_handler(handlers.refuse),
        "Hang": grpc.unary_unary_rpc_method_handler(handlers.hang),
        "Watch": grpc.unary_stream_rpc_method_handler(handlers.watch),
        "Status": grpc.unary_unary_rpc_method_handler(handlers.status),
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

            with pytest.raises(grpc.aio.AioRpcError) as refused_by_status:
                await channel.unary_unary(f"/{SERVICE}/Status", _raw, _raw)(b"later", timeout=5)
            assert refused_by_status.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused_by_status.value.details() == "not now: later"
            assert handlers.seen_peer.startswith("ipv4:127.0.0.1:")
            assert handlers.seen_auth.get("transport_security_type") == [b"insecure"]  # plaintext

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


class _ThreadCheckingContext:
    """A servicer context that records which thread touches it (grpc.aio calls are not thread-safe)."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.status: list[tuple[str, object]] = []

    def _touch(self) -> None:
        self.threads.add(threading.get_ident())

    def auth_context(self) -> dict[str, list[bytes]]:
        self._touch()
        return {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=controller-2"]}

    def peer(self) -> str:
        self._touch()
        return "ipv4:127.0.0.1:1"

    def set_code(self, code: grpc.StatusCode) -> None:
        self._touch()
        self.status.append(("code", code))

    def set_details(self, details: str) -> None:
        self._touch()
        self.status.append(("details", details))


async def test_a_handler_on_the_main_loop_never_touches_the_call_from_the_main_thread() -> None:
    # A controller crashed with SIGSEGV in auth_context() read from the main thread on a call the intake
    # loop was ending (its deadline passed while the process was SIGSTOPped).  Every read and write of the
    # real call must happen on the intake loop's thread.
    intake = IntakeLoop(name="test-intake-thread-check")
    intake.start()
    main_thread = threading.get_ident()
    seen: dict[str, Any] = {}

    async def behavior(request: bytes, context: Any) -> bytes:
        seen["thread"] = threading.get_ident()
        seen["auth"] = context.auth_context()
        seen["peer"] = context.peer()
        context.set_code(grpc.StatusCode.UNAVAILABLE)
        context.set_details("shutting down")
        return request

    handler = grpc.unary_unary_rpc_method_handler(behavior)
    hop = HopInterceptor(asyncio.get_running_loop(), intake.loop)
    fake = _ThreadCheckingContext()

    async def call_on_intake() -> bytes:
        async def continuation(_details: Any) -> Any:
            return handler

        wrapped = await hop.intercept_service(continuation, _details("/s/M"))
        unary = wrapped.unary_unary
        assert unary is not None
        result: bytes = await unary(b"req", fake)  # type: ignore[arg-type]
        return result

    try:
        assert await intake.run(call_on_intake()) == b"req"
    finally:
        intake.close()
    assert seen["thread"] == main_thread  # the handler ran on the main loop ...
    assert seen["auth"]["x509_subject"] == [b"CN=controller-2"] and seen["peer"] == "ipv4:127.0.0.1:1"
    assert main_thread not in fake.threads and len(fake.threads) == 1  # ... the call only on the intake's
    assert fake.status == [("code", grpc.StatusCode.UNAVAILABLE), ("details", "shutting down")]


async def test_the_hopping_handler_is_built_once_per_method_and_keeps_no_call_state() -> None:
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
            status = channel.unary_unary(f"/{SERVICE}/Status", _raw, _raw)
            for word in (b"one", b"two", b"three"):
                assert await echo(word, timeout=5) == b"echo:" + word
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await status(word, timeout=5)
                # each call's own status, though the calls share one wrapper
                assert refused.value.details() == f"not now: {word.decode()}"
            wrapped = dict(hop._wrapped)
            assert sorted(wrapped) == [f"/{SERVICE}/Echo", f"/{SERVICE}/Status"]
            assert await echo(b"four", timeout=5) == b"echo:four"
            assert hop._wrapped[f"/{SERVICE}/Echo"][1] is wrapped[f"/{SERVICE}/Echo"][1]  # not rebuilt
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await channel.unary_unary(f"/{SERVICE}/Nope", _raw, _raw)(b"", timeout=5)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert f"/{SERVICE}/Nope" not in hop._wrapped  # only methods the server has are kept
    finally:
        await intake.run(server.stop(grace=0))
        intake.close()


async def test_a_new_handler_object_for_a_method_is_wrapped_anew() -> None:
    intake = IntakeLoop(name="test-intake")
    intake.start()
    try:
        hop = HopInterceptor(asyncio.get_running_loop(), intake.loop, native=frozenset({"/s/Native"}))
        first = grpc.unary_unary_rpc_method_handler(Handlers().echo)
        second = grpc.unary_unary_rpc_method_handler(Handlers().echo)

        async def serving(handler: Any) -> Any:
            async def continuation(_: grpc.HandlerCallDetails) -> Any:
                return handler

            return continuation

        a = await hop.intercept_service(await serving(first), _details("/s/M"))
        assert await hop.intercept_service(await serving(first), _details("/s/M")) is a
        b = await hop.intercept_service(await serving(second), _details("/s/M"))
        assert b is not a and b.unary_unary is not None
        assert await hop.intercept_service(await serving(first), _details("/s/Native")) is first
        assert await hop.intercept_service(await serving(None), _details("/s/Gone")) is None
    finally:
        intake.close()


async def _wrapped_unary(hop: HopInterceptor, behavior: Any) -> Any:
    async def continuation(_details: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(behavior)

    wrapped = await hop.intercept_service(continuation, _details("/s/Unary"))
    assert wrapped.unary_unary is not None
    return wrapped.unary_unary


async def test_a_unary_answer_leaves_the_main_loop_in_the_handlers_last_step() -> None:
    """The answer is posted to the intake loop by the step in which the handler returns, not by a
    done-callback on a later main-loop turn (issue #17, session 14: that turn was as long as whatever
    else the main loop ran next).  The handler's last step schedules a main-loop callback that blocks the
    main thread until the intake loop has the answer: posted in that step, it arrives meanwhile; posted a
    turn later, it cannot (bounded wait, then the assertion fails)."""
    intake = IntakeLoop(name="test-intake-answer")
    intake.start()
    main = asyncio.get_running_loop()
    answered = threading.Event()
    arrived_while_main_was_held: list[bool] = []

    def hold_main() -> None:  # the main loop's next turn: held until the intake loop has the answer
        arrived_while_main_was_held.append(answered.wait(timeout=5))

    async def behavior(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(0)
        main.call_soon(hold_main)
        return b"answer:" + request

    hop = HopInterceptor(main, intake.loop)

    async def call_on_intake() -> bytes:
        unary = await _wrapped_unary(hop, behavior)
        result: bytes = await unary(b"req", _ThreadCheckingContext())
        answered.set()
        return result

    try:
        assert await intake.run(call_on_intake()) == b"answer:req"
    finally:
        intake.close()
    assert arrived_while_main_was_held == [True]


async def test_a_unary_call_cancelled_before_the_main_loop_took_it_still_cancels_its_handler() -> None:
    """The intake side gives up (deadline, client gone) before the main loop took the call: as through
    the generic hop, the handler starts and is cancelled at its first await — it sees the cancellation
    (the cancellation check of the first test relies on it under load), and nothing is left unawaited."""
    intake = IntakeLoop(name="test-intake-cancel")
    intake.start()
    main = asyncio.get_running_loop()
    ran: list[bytes] = []
    cancelled_seen = asyncio.Event()

    async def behavior(request: bytes, context: Any) -> bytes:
        ran.append(request)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled_seen.set()
            raise
        return request

    hop = HopInterceptor(main, intake.loop)

    async def call_and_cancel() -> bool:
        unary = await _wrapped_unary(hop, behavior)
        call: asyncio.Future[bytes] = asyncio.ensure_future(unary(b"req", _ThreadCheckingContext()))
        await asyncio.sleep(0)  # the call posted its handler to the main loop, which is held (below)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        return call.cancelled()

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Blocking: the main loop takes the posted start (and then the cancel) only after this.
            cancelled = asyncio.run_coroutine_threadsafe(call_and_cancel(), intake.loop).result(timeout=5)
            assert cancelled
            await asyncio.wait_for(cancelled_seen.wait(), 5)
            gc.collect()
        assert ran == [b"req"]
        assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
    finally:
        intake.close()
