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
- ``context.abort`` / ``write`` / ``read`` run on the intake loop (the call belongs to it); the getters
  (``peer``, ``auth_context``) are read there before the hop and the setters (``set_code``,
  ``set_details``) applied there after it — the main thread never touches the call (:class:`MainLoopContext`);
- a cancelled call (deadline, client gone) cancels the handler's task on the main loop.

Except the methods named in ``HopInterceptor(native=...)``: Raft's Fetch and FetchStream (every commit
waits on one round trip of them) run on the intake loop itself, and only the request crosses, through a
:class:`DriverBridge` — one ``call_soon_threadsafe`` to the driver and one back, called by the driver the
moment it answers.  The generic hops cost a fetch four crossings and a task on each loop, and the answer
left the main loop only after the driver had handed its fsync to a thread and the handler's task was woken
(docs/internals/raft-performance.md, "A lone write's path").  Likewise ``TestAppend`` and
``TestAppendStream`` with an :class:`AppendBridge`: the appends of many calls reach the driver as one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
import grpc.aio

from kraft.observability.thread_names import named_target, rename_native_thread
from kraft.raft.api import LeaderAndEpoch, RaftShutdownError
from kraft.raft.messages import RaftRequest, RaftResponse
from kraft.runtime import check_choices

T = TypeVar("T")

if TYPE_CHECKING:
    from kraft.raft.driver import PullSource  # annotations only: the intake process imports no driver

    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]  # generic in the stubs only
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

STOP_TIMEOUT_S = 5.0
_LOCAL_PEER_PREFIX = "unix:"
GRPC_POLLER_NAME = "grpc-poller"
"""The kernel name given to grpc.aio's process-wide poller thread (its completion queue's)."""
_GRPC_POLLER_TARGET = "(_poll_wrapper)"  # how CPython names that thread: "Thread-N (_poll_wrapper)"


def name_grpc_poller() -> None:
    """Name grpc.aio's poller thread ``grpc-poller`` to the kernel, once a server or channel was built on
    an intake loop.  A thread inherits the kernel name of the thread that starts it, and gRPC starts its
    poller with the process's first aio server or channel, from whichever thread that is: started from the
    intake loop it was a second ``grpc-intake`` thread — its CPU counted as intake work by
    ``bench.controller --cpu`` (two ``grpc-intake`` tids per node in
    bench/results/controller-session16-ab.json), and in the test processes a "leftover intake thread" that
    outlived the node (the poller lives as long as any aio object does).  Starting the poller from another
    thread instead (``grpc.aio.init_grpc_aio`` before the intake thread starts) needs an event loop on that
    thread, which a synchronous caller has not."""
    for thread in threading.enumerate():
        if thread.name.endswith(_GRPC_POLLER_TARGET) and thread.native_id is not None:
            rename_native_thread(thread.native_id, GRPC_POLLER_NAME)


class IntakeLoop:
    """A daemon thread running an event loop of the configured kind (uvloop by default)."""

    def __init__(self, name: str = "grpc-intake") -> None:
        factory = check_choices() or asyncio.new_event_loop
        self.loop: asyncio.AbstractEventLoop = factory()
        self._thread = threading.Thread(target=named_target(name, self._run), name=name, daemon=True)

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


class DriverSubmit(Protocol):
    """:meth:`kraft.raft.driver.RaftDriver.submit_request`: called on the main loop; calls ``reply`` on it
    once, with ``(response, None)`` or ``(None, error)``."""

    def __call__(
        self,
        request: RaftRequest,
        *,
        peer_id: int | None,
        reply: Callable[[RaftResponse | None, BaseException | None], None],
    ) -> None: ...


ReplyCallback = Callable[[RaftResponse | None, BaseException | None], None]


def _settle(
    future: asyncio.Future[RaftResponse], response: RaftResponse | None, error: BaseException | None
) -> None:
    if future.done():  # the call ended meanwhile (stream closed, deadline): nobody reads the answer
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert response is not None
        future.set_result(response)


class DriverBridge:
    """A :class:`~kraft.raft.transport.RequestHandler` for servicer code running on the intake loop: the
    request is handed to the driver on ``main`` and the answer posted back by the driver itself.

    Registered with the driver (:meth:`~kraft.raft.driver.RaftDriver.pull_during_flush`), it is a
    :class:`~kraft.raft.driver.PullSource`: the followers' Fetches that arrive while the leader's fsync
    runs wait here and are submitted when it returns, without a main-loop wake-up each — the driver would
    take them only then anyway ("Fewer wake-ups per batch (session 12)")."""

    def __init__(self, main: asyncio.AbstractEventLoop, submit: DriverSubmit) -> None:
        self._main = main
        self._submit = submit
        # The intake thread queues under the lock while held; the main thread takes the queue on release.
        self._lock = threading.Lock()
        self._held = False
        self._queued: list[tuple[RaftRequest, int | None, ReplyCallback]] = []
        self.pulled = 0  # requests taken at a flush's end instead of posted (the tests read it)

    async def handle_request(self, request: RaftRequest, *, peer_id: int | None = None) -> RaftResponse:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RaftResponse] = loop.create_future()

        def reply(response: RaftResponse | None, error: BaseException | None) -> None:  # on main
            with contextlib.suppress(RuntimeError):  # the intake loop is closed: the server is gone
                loop.call_soon_threadsafe(_settle, future, response, error)

        with self._lock:
            held = self._held
            if held:
                self._queued.append((request, peer_id, reply))
        if not held:
            self._main.call_soon_threadsafe(self._on_main, request, peer_id, reply)
        return await future

    def hold(self) -> None:
        """On main (the driver, a leader fsync starts): requests queue without waking the main loop."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """On main (the driver, the fsync returned): submit the queued requests, in arrival order."""
        with self._lock:
            self._held = False
            queued, self._queued = self._queued, []
        self.pulled += len(queued)
        for request, peer_id, reply in queued:
            self._on_main(request, peer_id, reply)

    def _on_main(self, request: RaftRequest, peer_id: int | None, reply: ReplyCallback) -> None:
        try:
            self._submit(request, peer_id=peer_id, reply=reply)
        except Exception as exc:  # a driver bug must come back as an error, not leave the call hanging
            reply(None, exc)


class DriverAppend(Protocol):
    """The driver's side of :class:`AppendBridge` (:class:`kraft.raft.driver.RaftDriver`), used on the main
    loop only."""

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch: ...

    def append_callback(
        self, records: Sequence[bytes], on_commit: Callable[[int | None, BaseException | None], None]
    ) -> int: ...

    def pull_during_flush(self, source: PullSource) -> None: ...


_Queued = tuple[list[bytes], "asyncio.Future[tuple[int, LeaderAndEpoch]]"]


class AppendBridge:
    """Raw-record appends from handlers on the intake loop (``TestAppend``), handed to the driver on
    ``main`` together: every append that arrives while the previous hand-off still waits for the main loop
    joins it, so a main-loop turn takes all of them as ONE :meth:`DriverAppend.append_callback` — one
    cross-thread call there and one back per hand-off instead of two per call, and no task, future or
    servicer context per call on the main loop (docs/internals/raft-performance.md, "The leader's cost
    per write and per record (session 11)").  Each caller still gets its own offsets, and only once its
    records are committed (acknowledged means durable).  Offsets are in arrival order: the records of one
    hand-off are appended in the order their calls came.

    While the leader's fsync runs the bridge is a :class:`~kraft.raft.driver.PullSource`: appends wait
    in the queue without waking the main loop, and the driver takes them all when the fsync returns
    (:meth:`release`) — they could not be written earlier anyway, and under load each wake-up cost the
    main thread a switch and a GIL hand-over ("Fewer wake-ups per batch (session 12)").  With no flush
    in flight an append is handed off at the end of its intake loop turn, as before: a lone write is
    written at once."""

    def __init__(self, main: asyncio.AbstractEventLoop, driver: DriverAppend) -> None:
        self._main = main
        self._driver = driver
        # Shared by the intake thread (appends) and the main thread (hand-off, hold, release): under the
        # lock, so an append either lands in the queue something will take — a hand-off already posted,
        # or the release of a hold — or posts a hand-off of its own.
        self._lock = threading.Lock()
        self._queued: list[_Queued] = []
        self._handoff_scheduled = False
        self._held = False  # the leader's fsync runs: the driver takes the queue when it returns
        self.handoffs = 0  # hand-offs that carried appends (the tests read it: calls share hand-offs)
        self.pulled = 0  # of them, taken by the driver at a flush's end (pull) rather than posted
        driver.pull_during_flush(self)

    async def append(self, values: list[bytes]) -> tuple[int, LeaderAndEpoch]:
        """Append ``values`` (at least one); returns (the last one's offset, the leader and epoch it was
        committed under) once committed.  Raises :class:`NotLeaderError` or :class:`RaftShutdownError`."""
        future: asyncio.Future[tuple[int, LeaderAndEpoch]] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._queued.append((values, future))
            schedule = not self._handoff_scheduled and not self._held
            if schedule:
                self._handoff_scheduled = True
        if schedule:
            # Posted at the end of this intake loop turn, not now: the calls handled in the same turn join
            # this hand-off, and the main loop is woken once for all of them.
            asyncio.get_running_loop().call_soon(self._post_handoff)
        return await future

    def _post_handoff(self) -> None:
        try:
            self._main.call_soon_threadsafe(self._handoff)
        except RuntimeError:  # the main loop is closed: nothing will take the queue, fail it
            with self._lock:
                queued, self._queued = self._queued, []
                self._handoff_scheduled = False
            _fail_all(queued, RaftShutdownError("the node's main loop is closed"))

    async def leader_and_epoch(self) -> LeaderAndEpoch:
        """The driver's current leader and epoch, read on the main loop (for answers that carry no append)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[LeaderAndEpoch] = loop.create_future()

        def read() -> None:  # on main
            with contextlib.suppress(RuntimeError):  # the intake loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle_value, future, self._driver.leader_and_epoch)

        self._main.call_soon_threadsafe(read)
        return await future

    def hold(self) -> None:
        """On main (the driver, a leader fsync starts): appends queue without waking the main loop."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """On main (the driver, the fsync returned): every append queued meanwhile as one driver append."""
        with self._lock:
            self._held = False
            queued, self._queued = self._queued, []
        if queued:
            self.pulled += 1
            self._append(queued)

    def _handoff(self) -> None:
        """On main: every queued append as one driver append."""
        with self._lock:
            queued, self._queued = self._queued, []
            self._handoff_scheduled = False
        if queued:
            self._append(queued)

    def _append(self, queued: list[_Queued]) -> None:
        self.handoffs += 1
        values = queued[0][0] if len(queued) == 1 else [value for each, _ in queued for value in each]
        try:
            self._driver.append_callback(values, lambda offset, error: self._committed(queued, offset, error))
        except Exception as exc:  # NotLeaderError, RaftShutdownError, or a driver bug: the callers hear it
            _post(queued, _fail_all, queued, exc)

    def _committed(self, queued: list[_Queued], last_offset: int | None, error: BaseException | None) -> None:
        """On main, called by the driver once: post the outcome to the callers' loop(s)."""
        if error is not None or last_offset is None:
            _post(queued, _fail_all, queued, error or RuntimeError("append ended without an offset"))
        else:
            _post(queued, _succeed_all, queued, last_offset, self._driver.leader_and_epoch)


def _post(queued: list[_Queued], callback: Callable[..., None], *args: Any) -> None:
    """Run ``callback(*args)`` on each loop the queued callers wait on (one, the intake loop, in practice)."""
    for loop in {future.get_loop() for _, future in queued}:
        with contextlib.suppress(RuntimeError):  # that loop is closed: the server is gone
            loop.call_soon_threadsafe(callback, *args)


def _settle_value(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _fail_all(queued: list[_Queued], error: BaseException) -> None:
    loop = asyncio.get_running_loop()
    for _, future in queued:
        if not future.done() and future.get_loop() is loop:
            future.set_exception(error)


def _succeed_all(queued: list[_Queued], last_offset: int, leader: LeaderAndEpoch) -> None:
    """Each caller's last offset: the hand-off's records were appended in queue order, ending at
    ``last_offset``."""
    loop = asyncio.get_running_loop()
    offset = last_offset
    for values, future in reversed(queued):
        if not future.done() and future.get_loop() is loop:  # a cancelled call: its records stay appended
            future.set_result((offset, leader))
        offset -= len(values)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


async def _hop(coro: Awaitable[T], loop: asyncio.AbstractEventLoop) -> T:
    """Await ``coro`` on ``loop`` from the current loop; cancelling the waiter cancels it there."""
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(_as_coro(coro), loop)
    return await asyncio.wrap_future(future)


async def _as_coro(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _hop_answer(awaitable: Awaitable[T], main: asyncio.AbstractEventLoop) -> T:
    """:func:`_hop` for a unary handler: await ``awaitable`` in a task on ``main`` whose last step posts the
    outcome to this loop itself.  Through ``run_coroutine_threadsafe`` the outcome left the main loop one
    turn after the handler returned (the task's done-callbacks run on the next turn, then set a
    ``concurrent.futures.Future`` whose callback posts it) — a turn, on a lone CreateTopics, as long as
    whatever else the main loop runs then (the listener's next step, the driver), while the intake thread
    waited (docs/internals/raft-performance.md, "A lone CreateTopics' hops, traced (session 14)").
    Cancelling the waiter cancels the task on ``main``, as with :func:`_hop`."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[T] = loop.create_future()
    tasks: list[asyncio.Task[None]] = []

    def post(settle: Callable[..., None], *args: Any) -> None:  # on main
        with contextlib.suppress(RuntimeError):  # this loop is closed: the server is gone
            loop.call_soon_threadsafe(settle, answer, *args)

    async def run() -> None:  # on main
        try:
            result = await awaitable
        except asyncio.CancelledError:
            post(_cancel_answer)
            raise
        except BaseException as exc:  # the handler's error (_Abort included) is the call's
            post(_fail_answer, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            post(_settle_value, result)

    def start() -> None:  # on main
        tasks.append(main.create_task(run()))

    def cancel() -> None:  # on main, after start (both posted in order)
        if tasks:
            # Next turn, after the task's first step (scheduled by start): a call given up before the
            # main loop took it still starts its handler, which is then cancelled at its first await —
            # as through _hop, whose task always took that step (test_intake.py's cancellation checks
            # rely on it; cancelled before its first step, the handler would never see it).
            main.call_soon(tasks[0].cancel)

    try:
        main.call_soon_threadsafe(start)
    except RuntimeError:
        _close(awaitable)  # the main loop is closed: the handler never runs
        raise
    try:
        return await answer
    except asyncio.CancelledError:
        with contextlib.suppress(RuntimeError):  # the main loop is closed: nothing left to cancel
            main.call_soon_threadsafe(cancel)
        raise


def _close(awaitable: Awaitable[Any]) -> None:
    if inspect.iscoroutine(awaitable):
        awaitable.close()


def _fail_answer(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _cancel_answer(future: asyncio.Future[Any]) -> None:
    future.cancel()


async def _aclose(generator: Any) -> None:
    with contextlib.suppress(Exception):  # e.g. still running its cancelled step: it ends by itself
        await generator.aclose()


def _close_later(generator: Any, loop: asyncio.AbstractEventLoop) -> None:
    task = loop.create_task(_aclose(generator))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()


class MainLoopContext:
    """The servicer context a handler on the main loop sees.  The handler never touches the real call:
    a grpc.aio call is not thread-safe, and one read from the main thread while the intake loop ended it
    crashed a controller (SIGSEGV in ``auth_context()`` on a MetadataFetch whose deadline passed while the
    process was SIGSTOPped, chaos ``pause``).  So what a handler reads (``auth_context``, ``peer``) is
    taken on the intake loop before the hop, what it sets (``set_code``, ``set_details``) is kept here and
    applied on the intake loop when the handler returns (:meth:`apply_status`), and call-level operations
    (``abort``, ``write``, ``read``) run there.  Anything else a handler needs of the call must be added
    here the same way; there is deliberately no pass-through."""

    def __init__(
        self, context: grpc.aio.ServicerContext[Any, Any], intake: asyncio.AbstractEventLoop
    ) -> None:
        self._context = context
        self._intake = intake
        self._auth_context = context.auth_context()
        self._peer = context.peer()
        # A call from an intake process (over the unix socket) carries its caller's identity as metadata
        # (kraft.security.principal.auth_context_of): kept for the handler; others need none of it.
        self._metadata: Any = (
            context.invocation_metadata() if self._peer.startswith(_LOCAL_PEER_PREFIX) else ()
        )
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None

    def auth_context(self) -> Any:
        return self._auth_context

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> Any:
        """The call's metadata on unix-socket calls (intake processes' forwarded identity), else empty."""
        return self._metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def apply_status(self) -> None:
        """On the intake loop: hand the status the handler set to the real call."""
        if self._code is not None:
            self._context.set_code(self._code)
        if self._details is not None:
            self._context.set_details(self._details)

    def discard_status(self) -> None:
        self._code = self._details = None

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Abort(code, details, trailing_metadata)  # the intake side aborts the real call

    async def write(self, message: Any) -> None:
        await _hop(self._context.write(message), self._intake)

    async def read(self) -> Any:
        return await _hop(self._context.read(), self._intake)


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
        *,
        native: frozenset[str] = frozenset(),
        replace: Mapping[str, grpc.RpcMethodHandler[Any, Any]] | None = None,
    ) -> None:
        """``native``: full method names (``/kraft.v1.RaftService/FetchStream``) whose handlers run on the
        intake loop as they are — they must touch no main-loop state but through a :class:`DriverBridge`.
        ``replace``: full method name -> a handler served on the intake loop instead of the server's (same
        rule; ``BrokerHeartbeat`` through :class:`kraft.node.controller_bridge.HeartbeatBridge`)."""
        self._main = main
        self._intake = intake
        self._native = native
        self._replace: Mapping[str, grpc.RpcMethodHandler[Any, Any]] = replace or {}
        # method -> (the server's handler, its hopping wrapper): the wrapper holds no per-call state, so
        # it is built once per method, not for every call (a lone CreateTopics built it anew each time).
        # Only methods the server has a handler for get here: bounded by the services registered.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or (self._native and method in self._native):
            return handler
        replaced = self._replace.get(method) if self._replace else None
        if replaced is not None:
            return replaced
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary),
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

    def _unary(self, behavior: Callable[..., Any], stream_in: bool = False) -> Callable[..., Any]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            inputs = self._inputs(request, context, stream_in)
            try:
                return await _hop_answer(behavior(*inputs), self._main)
            except _Abort as abort:
                inputs[1].discard_status()  # the abort's status is the call's
                await context.abort(abort.code, abort.details, abort.trailing_metadata)
            finally:
                inputs[1].apply_status()

        return handle

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
                inputs[1].discard_status()  # the abort's status is the call's
                await context.abort(abort.code, abort.details, abort.trailing_metadata)
            finally:
                inputs[1].apply_status()

        return handle


async def run_writing_on_main(
    behavior: Callable[[AsyncIterator[Any], MainLoopContext], Awaitable[None]],
    requests: AsyncIterator[Any],
    context: grpc.aio.ServicerContext[Any, Any],
    main: asyncio.AbstractEventLoop,
) -> None:
    """On the intake loop: run ``behavior`` — a stream-in handler answering with ``context.write`` — on
    ``main``, exactly as :class:`HopInterceptor` runs a server's handler there: the request stream read on
    the intake loop, the call seen through a :class:`MainLoopContext`, its abort or status applied to the
    real call here.  For an intake-loop handler that answers part of a call itself and hands the rest on
    (:class:`kraft.node.batch_lane.BatchLane`)."""
    intake = asyncio.get_running_loop()
    main_context = MainLoopContext(context, intake)
    try:
        await _hop(behavior(_RequestsFromIntake(requests, intake), main_context), main)
    except _Abort as abort:
        main_context.discard_status()  # the abort's status is the call's
        await context.abort(abort.code, abort.details, abort.trailing_metadata)
    finally:
        main_context.apply_status()
