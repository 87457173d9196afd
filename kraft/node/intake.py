"""The request plane: a controller node's gRPC server on its own thread and event loop.

grpc.aio takes in few new calls per loop turn, so on one loop a long turn of the state machine (a bulk
slice, a commit's replay) holds back every heartbeat that arrives meanwhile.  Measured with
``python -m bench.intake`` (2 cores, 16 clients, 50 µs of state-machine work per request, 5 ms bulk
slices back to back on the state machine's loop): one loop answers 40 calls/s at p50 452 ms; the server on
an intake thread 564 calls/s at p50 24 ms (docs/internals/raft-performance.md, "Request plane").

:class:`IntakeLoop` runs that loop.  :class:`HopInterceptor`, installed on the server, runs every handler
— RaftService, ControllerService, health, test services alike — on the node's *main* loop (where Raft,
the controller and every servicer's state live) and carries its answer back, so no servicer changes:

- unary requests: one hop there, one back;
- request streams: each ``__anext__`` of the request iterator hops back to the intake loop;
- response streams (async generators, or handlers calling ``context.write``): each item hops back;
- ``context.abort`` / ``write`` / ``read`` run on the intake loop (the call belongs to it); the setters
  and getters (``set_code``, ``peer``, ``auth_context``, ...) are called directly;
- a cancelled call (deadline, client gone) cancels the handler's task on the main loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from kraft.observability.metrics import StageRecorder
from kraft.runtime import check_choices

T = TypeVar("T")

if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]  # generic in the stubs only
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

STOP_TIMEOUT_S = 5.0


class IntakeLoop:
    """A daemon thread running an event loop of the configured kind (uvloop by default)."""

    def __init__(self, name: str = "grpc-intake") -> None:
        factory = check_choices() or asyncio.new_event_loop
        self.loop: asyncio.AbstractEventLoop = factory()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the intake loop; await its result from the caller's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        """Stop the loop and join the thread (after the server on it stopped)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(STOP_TIMEOUT_S)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


async def _hop(coro: Awaitable[T], loop: asyncio.AbstractEventLoop, eager: bool = False) -> T:
    """Await ``coro`` on ``loop`` from the current loop; cancelling the waiter cancels it there.  With
    ``eager`` its first step runs in the callback that receives it (:func:`start_eagerly`)."""
    future: concurrent.futures.Future[T] = (
        start_eagerly(coro, loop) if eager else asyncio.run_coroutine_threadsafe(_as_coro(coro), loop)
    )
    return await asyncio.wrap_future(future)


def start_eagerly(coro: Awaitable[T], loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[T]:
    """Like ``run_coroutine_threadsafe``, but the coroutine's first step runs in the callback itself
    rather than in a task's first step one loop turn later (Python 3.12's eager tasks, by hand for 3.11).
    A coroutine that finishes without suspending — a heartbeat that changes nothing — thus costs the
    loop one turn, not two; one that suspends goes on as a task.  Each turn of a busy main loop is as
    long as everything else ready in it, which is most of a heartbeat's latency under bulk work.

    The first step runs outside any task: only for handlers that need no current task there (no
    ``asyncio.timeout``, ``asyncio.current_task``) — see ``HopInterceptor(eager_methods=...)``.
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    steps = _as_coro(coro)

    def start() -> None:
        if future.cancelled():  # the call ended before it got here: never run it
            steps.close()
            if inspect.iscoroutine(coro):
                coro.close()
            return
        try:
            yielded = steps.send(None)
        except StopIteration as done:
            _settle(future, done.value, None)
            return
        except BaseException as exc:
            _settle(future, None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        task = loop.create_task(_resume(steps, yielded))
        task.add_done_callback(lambda t: _settle_from_task(future, t))
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(task.cancel) if f.cancelled() else None)

    loop.call_soon_threadsafe(start)
    return future


def _settle(future: concurrent.futures.Future[T], value: Any, exc: BaseException | None) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)


def _settle_from_task(future: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    if task.cancelled():
        future.cancel()
    else:
        exc = task.exception()
        _settle(future, None if exc is not None else task.result(), exc)


class _Resumed:
    """Awaitable that goes on with a coroutine whose first step ran outside any task: it hands the task
    what the coroutine last yielded (a future to wait for, or None for a bare yield) and, once the task
    resumes, resumes the coroutine — what the task would have done with the coroutine itself."""

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, T], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Any:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (a cancellation)
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    yielded = coro.send(None)
                except StopIteration as done:
                    return done.value


async def _resume(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    result: T = await _Resumed(coro, yielded)
    return result


async def _as_coro(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _aclose(generator: Any) -> None:
    with contextlib.suppress(Exception):  # e.g. still running its cancelled step: it ends by itself
        await generator.aclose()


def _close_later(generator: Any, loop: asyncio.AbstractEventLoop) -> None:
    task = loop.create_task(_aclose(generator))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()


class MainLoopContext:
    """The servicer context a handler on the main loop sees: call-level operations go to the intake loop."""

    def __init__(
        self, context: grpc.aio.ServicerContext[Any, Any], intake: asyncio.AbstractEventLoop
    ) -> None:
        self._context = context
        self._intake = intake

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Abort(code, details, trailing_metadata)  # the intake side aborts the real call

    async def write(self, message: Any) -> None:
        await _hop(self._context.write(message), self._intake)

    async def read(self) -> Any:
        return await _hop(self._context.read(), self._intake)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class _RequestsFromIntake:
    """The request stream of a call, read from the main loop (each item fetched on the intake loop)."""

    def __init__(self, requests: AsyncIterator[Any], intake: asyncio.AbstractEventLoop) -> None:
        self._requests = requests
        self._intake = intake

    def __aiter__(self) -> _RequestsFromIntake:
        return self

    async def __anext__(self) -> Any:
        return await _hop(self._requests.__anext__(), self._intake)


class HopInterceptor(_ServerInterceptor):
    """Runs every handler of the server on ``main`` (see the module docstring)."""

    def __init__(
        self,
        main: asyncio.AbstractEventLoop,
        intake: asyncio.AbstractEventLoop,
        stages: StageRecorder | None = None,
        eager_methods: frozenset[str] = frozenset(),
    ) -> None:
        self._main = main
        self._intake = intake
        self._stages = stages
        self._eager_methods = eager_methods
        """Unary methods whose handlers start in the hop's own callback (:func:`start_eagerly`)."""
        """Where unary calls' hop_in / handler / hop_out / total times go (per method)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.unary_unary is not None:
            method = handler_call_details.method.rpartition("/")[2]
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method=method, eager=method in self._eager_methods),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, stream_in=False),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, stream_in=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, stream_in=True),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _inputs(self, request: Any, context: Any, stream_in: bool) -> tuple[Any, MainLoopContext]:
        main_context = MainLoopContext(context, self._intake)
        return (_RequestsFromIntake(request, self._intake) if stream_in else request), main_context

    def _unary(
        self,
        behavior: Callable[..., Any],
        stream_in: bool = False,
        method: str | None = None,
        eager: bool = False,
    ) -> Callable[..., Any]:
        stages = self._stages if method is not None else None

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            inputs = self._inputs(request, context, stream_in)
            try:
                return await _hop(behavior(*inputs), self._main, eager)
            except _Abort as abort:
                await context.abort(abort.code, abort.details, abort.trailing_metadata)

        if stages is None or method is None:
            return handle

        async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            start = time.perf_counter()
            marks = [start, start]  # on the main loop: handler start, handler end

            async def on_main() -> Any:
                marks[0] = time.perf_counter()
                try:
                    return await behavior(*inputs)
                finally:
                    marks[1] = time.perf_counter()

            inputs = self._inputs(request, context, stream_in)
            try:
                return await _hop(on_main(), self._main, eager)
            except _Abort as abort:
                await context.abort(abort.code, abort.details, abort.trailing_metadata)
            finally:
                end = time.perf_counter()
                if marks[1] > start:
                    stages.observe(method, "hop_in", marks[0] - start)
                    stages.observe(method, "handler", marks[1] - marks[0])
                    stages.observe(method, "hop_out", end - marks[1])
                stages.observe(method, "total", end - start)

        return timed

    def _streaming(self, behavior: Callable[..., Any], stream_in: bool) -> Callable[..., Any]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            inputs = self._inputs(request, context, stream_in)
            try:
                result = behavior(*inputs)
                if not inspect.isasyncgen(result):
                    await _hop(result, self._main)  # writes through context.write, returns None
                    return
                responses = result
                try:
                    while True:
                        try:
                            item = await _hop(responses.__anext__(), self._main)
                        except StopAsyncIteration:
                            return
                        yield item
                finally:
                    # the call ended early (cancelled, client gone): close the generator where it runs
                    self._main.call_soon_threadsafe(_close_later, responses, self._main)
            except _Abort as abort:
                await context.abort(abort.code, abort.details, abort.trailing_metadata)

        return handle
