"""Calls to the active controller: find it among ``controller.quorum.voters``, follow NOT_CONTROLLER.

:meth:`ControllerClient.call` sends one request to the controller believed active; on a transport error
or a NOT_CONTROLLER answer without a usable hint it moves on to the next voter, and on NOT_CONTROLLER
with a hint it goes straight to the named controller (its address taken from our own voter list when the id
is a voter we know, else from the hint).  It gives up after one round over the voters (plus
the redirects) with :class:`ControllerUnavailable`; retry pacing (backoff) belongs to the caller, which
knows whether it is registering, heartbeating or fetching.

Which voter is asked when no active controller is known: the next in a rotation that starts at
``first_voter`` (the CLI's is random, as Kafka's ``NetworkClient.leastLoadedNode`` starts at a random offset,
so a dead first bootstrap address does not cost every command one request timeout), skipping voters whose
last attempt failed in transport (refused, black-holed, not a controller) while one that has not failed is
left — a dead address costs a client one attempt, not one per round.  A voter that answers is forgotten
as failed; when all have failed the rotation starts over (a controller may be back).

Time, as Kafka splits it: ``timeout_s`` is the *whole call's* deadline (Kafka's ``default.api.timeout.ms``
for an admin call, the channel manager's retry timeout for a broker's requests), which no sequence of
redirects and resends exceeds; each attempt gets ``min(request timeout, what is left)`` (Kafka's
``request.timeout.ms``, cut to the deadline as KAFKA-14392 cut the broker's heartbeat RPCs).  Before, every
attempt got the full ``timeout_s``: a heartbeat sent with "2 s" over 3 voters could be answered after 10 s,
past the broker's session, and each resend was one more request on an overloaded controller.  A request
timeout below the deadline leaves time, after a black-holed controller's attempt runs out, to ask
another voter who is active.

Which controllers are in the rotation: the configured ones (``controller.quorum.voters``, or the bootstrap
servers of a dynamic quorum), plus controllers named by NOT_CONTROLLER hints that the list lacks — until
the active controller sends its voter set (KIP-853: the MetadataFetch answer's ``voters``, which the
broker's fetcher hands to :meth:`ControllerClient.learn_voter_set`).  From then on the latest voter set
wins, as on Kafka's brokers, which learn it from the VotersRecords of the log they replicate and resolve
the leader through it (``RaftControllerNodeProvider`` → ``KafkaRaftClient.voterNode``): the voters are
the rotation, hint-learned entries are dropped, a removed controller leaves it, and the configured
bootstrap servers stay only as a last resort (asked when every voter's last attempt failed — as Kafka's
observers fall back to ``controller.quorum.bootstrap.servers`` when they know no leader).  So a broker
whose bootstrap controllers were all removed and stopped still finds every later leader.

Channels are kept per controller, so gRPC's own reconnect backoff must stay short: with its defaults
(1 s, growing 1.6-fold up to 120 s) a channel to a controller that was down for a few seconds fails every call
with UNAVAILABLE "failed to connect to all addresses" for up to ~4 s after that controller is back — and if
it is the new active controller, it fences this broker for a missed session meanwhile.  Bounded like
Kafka's ``reconnect.backoff.ms`` / ``reconnect.backoff.max.ms`` (and like the Raft transport's channels).
The channels come from a :class:`kraft.client.channel.ChannelPool`, so a broker's long-lived client
follows a rotation of its keystore/truststore files without a restart.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from kraft.client.channel import ChannelPool, ChannelSecurity, PoolLog
from kraft.client.rotation import NodeRotation
from kraft.clock import Clock, SystemClock
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc
from kraft.v1.common_pb2 import NodeRef

if TYPE_CHECKING:
    from kraft.v1.controller_pb2_grpc import ControllerServiceAsyncStub


RECONNECT_BACKOFF_MS = 100  # Kafka's reconnect.backoff.ms is 50
MAX_RECONNECT_BACKOFF_MS = 1000  # Kafka's reconnect.backoff.max.ms
MAX_LEARNED_CONTROLLERS = 16
"""Controllers learned from NOT_CONTROLLER hints kept in the rotation (a quorum has 3 or 5 voters)."""
MAX_LEARNED_VOTERS = 16
"""The most voters a learned voter set may list (a quorum has 3 or 5: each commit waits on a majority, so
Raft quorums stay small); an answer listing more is refused, so that a hostile or buggy controller cannot
grow a broker's rotation — and every call's round of attempts over it — without bound."""
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
"""A DNS name (RFC 1123 labels; ``_`` allowed, as container runtimes name hosts with it)."""
NO_VOTER_SET = (-1, -1)
"""The version (leader epoch, offset) of the voter set a client holds before it learned one."""
MIN_ATTEMPT_S = 0.05
"""No further attempt starts with less of the call's deadline left: an answer that quick from a controller
that just timed out or moved is unlikely, and the request would only add to its load."""


class _ControllerResponse(Protocol):
    @property
    def error_code(self) -> int: ...

    @property
    def controller(self) -> NodeRef: ...


ResponseT = TypeVar("ResponseT", bound=_ControllerResponse)
# Selects the RPC on a stub: ``lambda stub: stub.BrokerHeartbeat``.
MethodPicker = Callable[["ControllerServiceAsyncStub"], Callable[..., Awaitable[ResponseT]]]


class ControllerUnavailable(Exception):
    """No controller answered as the active one in this round.

    ``unreachable``: every target failed at the transport level (nothing answered at all);
    ``not_controllers``: targets that answered gRPC but serve no ControllerService (UNIMPLEMENTED —
    e.g. a broker's address given as a controller's)."""

    def __init__(
        self, message: str, *, unreachable: bool = False, not_controllers: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        self.not_controllers = tuple(not_controllers)


class OutcomeUnknown(ControllerUnavailable):
    """A non-idempotent request may have been applied: its RPC was sent and then timed out or the
    connection broke before the answer (kraft.errors: "outcome unknown").  Never resent by the client."""


def _nothing_sent(err: grpc.aio.AioRpcError) -> bool:
    """True when the RPC failed before the request reached a server (connect failure)."""
    if err.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    details = (err.details() or "").lower()
    return "failed to connect" in details or "connection refused" in details or "dns" in details


def _deposed_answer(response: _ControllerResponse) -> bool:
    """REQUEST_TIMED_OUT with a ``controller`` ref: appended, then leadership was lost (a commit timeout
    carries no ref) — the ref names the new active controller, or -1 when it is not known yet."""
    return (
        response.error_code == ErrorCode.REQUEST_TIMED_OUT
        and isinstance(response, Message)
        and response.HasField("controller")
    )


def _valid_host(host: str) -> bool:
    """A host a voter may name: an IP literal or a DNS name of at most 253 characters."""
    if len(host) > 253:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOSTNAME.fullmatch(host) is not None


def voter_set_refusal(voters: cpb.QuorumVoters) -> str | None:
    """Why a voter set a controller sent is not taken (None: it may be): more than
    :data:`MAX_LEARNED_VOTERS` voters, a negative or repeated node id, an endpoint whose host is no IP
    literal or DNS name or whose port is outside 0..65535, or two voters naming one endpoint.  An endpoint
    with no host or port 0 is not refused: it is one that cannot be dialled (``learn_voter_set`` skips it)."""
    if len(voters.voters) > MAX_LEARNED_VOTERS:
        return f"{len(voters.voters)} voters, more than the {MAX_LEARNED_VOTERS} a quorum may have"
    seen_ids: set[int] = set()
    seen_endpoints: dict[tuple[str, int], int] = {}
    for voter in voters.voters:
        if voter.node_id < 0 or voter.node_id in seen_ids:
            return f"node id {voter.node_id} is {'negative' if voter.node_id < 0 else 'listed twice'}"
        seen_ids.add(voter.node_id)
        for endpoint in voter.endpoints:
            if not 0 <= endpoint.port < 65536:
                return f"voter {voter.node_id} has port {endpoint.port}"
            if not endpoint.host or endpoint.port == 0:
                continue
            if not _valid_host(endpoint.host):
                return f"voter {voter.node_id} has host {endpoint.host[:64]!r}"
            other = seen_endpoints.setdefault((endpoint.host.lower(), endpoint.port), voter.node_id)
            if other != voter.node_id:
                return f"voters {other} and {voter.node_id} both name {endpoint.host}:{endpoint.port}"
    return None


def _voter_target(voter: tuple[int, str]) -> str:
    return voter[1]


def _hint_target(hint: NodeRef) -> str:
    host, port = hint.endpoint.host or "127.0.0.1", hint.endpoint.port
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def refusal(err: grpc.aio.AioRpcError) -> KraftError | None:
    """A PERMISSION_DENIED answer as the error it names (``CLUSTER_AUTHORIZATION_FAILED: …``): another
    controller would answer the same, so it is not retried; None for any other status."""
    if err.code() != grpc.StatusCode.PERMISSION_DENIED:
        return None
    details = err.details() or ""
    name, sep, message = details.partition(": ")
    code = ErrorCode.__members__.get(name) if sep else None
    if code is None:
        return KraftError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, details or "permission denied")
    return KraftError(code, message)


class ControllerClient:
    def __init__(
        self,
        voters: Sequence[tuple[int, str]],
        *,
        max_message_bytes: int = 16 * 1024 * 1024,
        max_reconnect_backoff_ms: int = MAX_RECONNECT_BACKOFF_MS,
        security: ChannelSecurity | None = None,
        on_retry: Callable[[str], None] | None = None,
        log: PoolLog | None = None,
        channels: ChannelPool | None = None,
        request_timeout_s: float | None = None,
        clock: Clock | None = None,
        first_voter: int = 0,
        listener_names: Sequence[str] = (),
    ) -> None:
        """``voters``: ``(node id, "host:port")`` of every controller (the bootstrap list); ``security``:
        how their listener is dialled (None: the process default, e.g. the CLI's ``--command-config``);
        ``on_retry`` is told, one line each, why a call moves to another controller (``--verbose``);
        ``log`` hears of certificate rotations; ``channels`` replaces the pool built from ``security``
        (tests pace its checks with a clock); ``request_timeout_s`` caps one attempt of a call (None:
        an attempt may take all that is left of the call's deadline); ``clock`` measures the deadlines;
        ``first_voter``: the index in ``voters`` asked first while no active controller is known (the CLI
        passes a random one, as Kafka's ``leastLoadedNode`` starts at a random offset); ``listener_names``:
        ``controller.listener.names``, which pick a learned voter's endpoint (else its first)."""
        if not voters:
            raise ValueError("the controller client needs at least one voter")
        if request_timeout_s is not None and request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, not {request_timeout_s}")
        self._request_timeout_s = request_timeout_s
        self._clock: Clock = clock or SystemClock()
        self._voters = list(voters)
        self._voter_targets = dict(self._voters)
        initial_backoff_ms = min(RECONNECT_BACKOFF_MS, max_reconnect_backoff_ms)
        self._options = options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", initial_backoff_ms),
            # gRPC core's minimum time for one connection attempt, not a backoff (GrpcTransport's
            # channel_options say why it is not 100 ms)
            ("grpc.min_reconnect_backoff_ms", max_reconnect_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms),
        ]
        self._channels = channels or ChannelPool(options, security, log=log, name="controller_client")
        # One stub per channel: building one creates a callable per RPC (a heartbeat's worth of CPU).
        self._stubs: dict[str, tuple[grpc.aio.Channel, ControllerServiceAsyncStub]] = {}
        self._active: tuple[int, str] | None = None
        # True once a controller answered as the active one or was named by another: only then is a
        # DEADLINE_EXCEEDED "slow, not gone" — a voter merely picked to ask first that never answers failed.
        self._confirmed = False
        # Which voter to ask while no active controller is known (kraft.client.rotation: the rule every
        # client shares): voters whose last attempt failed in transport (refused, black-holed, not a
        # controller) are not asked again while one that has not failed is left.
        self._rotation = NodeRotation(self._voters, _voter_target, first=first_voter)
        # Controllers named by a hint that the voter list lacks (id → address): a dynamic quorum's leader
        # that the bootstrap list does not name.  Asked in the rotation from then on, so a client whose
        # bootstrap controllers went away (removed, stopped) can still find the active one — as Kafka's
        # brokers know every voter (they learn the voter set from the log; ours from hints until the
        # active controller sends its voter set, which then replaces them: learn_voter_set).
        self._learned: dict[int, str] = {}
        # The voter set the active controller sent (id → address) and its version (leader epoch, offset):
        # once known, the rotation (see the module's docstring).
        self._voter_set: dict[int, str] = {}
        self._voter_set_version = NO_VOTER_SET
        self._listener_names = tuple(listener_names)
        self._on_retry = on_retry
        self._log = log

    @property
    def active_controller_id(self) -> int:
        return -1 if self._active is None else self._active[0]

    @property
    def request_timeout_s(self) -> float | None:
        """The cap on one attempt of a call (None: an attempt may take all that is left of its deadline)."""
        return self._request_timeout_s

    @property
    def voter_set_version(self) -> tuple[int, int]:
        """(leader epoch, offset) of the voter set learned last; :data:`NO_VOTER_SET` before one."""
        return self._voter_set_version

    @property
    def voter_set(self) -> dict[int, str]:
        """The learned voter set, id → ``host:port`` (empty before one was learned)."""
        return dict(self._voter_set)

    @property
    def rotation(self) -> list[tuple[int, str]]:
        """Every controller the rotation holds, in its order (diagnostics, tests)."""
        return self._rotation.nodes

    def learn_voter_set(self, voters: cpb.QuorumVoters) -> bool:
        """Take the voter set an active controller sent when it is newer than the one held (by leader
        epoch, then offset: see ``VoterSetVersion``); True when that changed the voters or their addresses.
        A voter without a usable endpoint is left out; a set with none left keeps the rotation as it is
        (nothing in it to dial), its version taken all the same so that it is not sent again and again.
        A set :func:`voter_set_refusal` refuses (too many voters, a repeated id, an invalid host or port)
        is not taken either: the rotation stays, one ``controller_voters_refused`` line is logged, and its
        version is taken, so that the controller does not send it (nor we log it) with every answer."""
        version = (voters.version.leader_epoch, voters.version.offset)
        if version <= self._voter_set_version:
            return False
        self._voter_set_version = version
        refused = voter_set_refusal(voters)
        if refused is not None:
            if self._log is not None:
                self._log.warning(
                    "controller_voters_refused",
                    reason=refused,
                    voters=len(voters.voters),
                    leader_epoch=version[0],
                    offset=version[1],
                )
            return False
        learned: dict[int, str] = {}
        for voter in voters.voters:
            target = self._voter_address(voter)
            if voter.node_id >= 0 and target is not None:
                learned[voter.node_id] = target
        if not learned:
            return False
        changed = learned != self._voter_set
        self._voter_set = learned
        self._learned.clear()  # the latest voter set wins over what peers hinted before it
        self._rebuild_rotation()
        return changed

    def _voter_address(self, voter: cpb.QuorumVoter) -> str | None:
        """``host:port`` of ``voter``'s endpoint on our controller listener (else its first); None if it
        has none that can be dialled."""
        endpoints = [e for e in voter.endpoints if e.host and 0 < e.port < 65536]
        if not endpoints:
            return None
        rank = {name.upper(): index for index, name in enumerate(self._listener_names)}
        chosen = min(endpoints, key=lambda e: rank.get(e.name.upper(), len(rank)))  # first of a rank
        return f"[{chosen.host}]:{chosen.port}" if ":" in chosen.host else f"{chosen.host}:{chosen.port}"

    @property
    def active_target(self) -> str | None:
        """The address of the controller believed active (None: not known yet)."""
        return None if self._active is None else self._active[1]

    def channel(self, target: str) -> grpc.aio.Channel:
        """The pool's channel to ``target`` (kraft.client.heartbeat_stream opens its stream on it)."""
        return self._channels.get(target)

    async def call(
        self,
        pick: MethodPicker[ResponseT],
        request: Any,
        timeout_s: float,
        *,
        idempotent: bool = True,
        attempt_timeout_s: float | None = None,
        active_timed_out: bool = False,
    ) -> ResponseT:
        """Send ``request`` to the active controller; the answer is never NOT_CONTROLLER.

        ``timeout_s`` bounds the whole call, every redirect and resend included; one attempt gets at most
        ``attempt_timeout_s`` (default: the client's ``request_timeout_s``, else the whole deadline) and
        never more than is left.  When the deadline runs out before an answer, :class:`ControllerUnavailable`
        names the last error (a non-idempotent request that timed out raises :class:`OutcomeUnknown`
        first, as always).  ``active_timed_out``: the active controller already let this request's time
        run out on another path (a heartbeat stream): the first attempt asks another voter, as after a
        DEADLINE_EXCEEDED here, so a black-holed active controller is not asked twice.

        NOT_CONTROLLER (nothing was done) and connect failures are always followed to another
        controller.  When the outcome is unknown — a deadline or broken connection after the request
        was sent, or REQUEST_TIMED_OUT naming a new controller (appended, then deposed) — an
        ``idempotent`` request is resent to the (new) active controller; any other raises
        :class:`OutcomeUnknown` or returns that answer, and the caller reconciles.  A refusal by the
        authorizer raises :class:`KraftError` (TOPIC_/CLUSTER_AUTHORIZATION_FAILED) at once."""
        attempts = len(self._rotation) + 2
        last_error = "no controller tried"
        answered = False
        not_controllers: list[str] = []
        instead: tuple[int, str] | None = None  # another voter to try in this call only
        if active_timed_out and self._active is not None:
            instead = self._other_voter(self._active[1])
        cap_s = attempt_timeout_s if attempt_timeout_s is not None else self._request_timeout_s
        deadline_ms = self._clock.monotonic_ms() + timeout_s * 1000
        for attempt in range(attempts):
            left_s = (deadline_ms - self._clock.monotonic_ms()) / 1000
            if attempt > 0 and left_s < MIN_ATTEMPT_S:  # the first attempt always goes out
                last_error = f"{last_error}; the call's {timeout_s:g} s deadline passed"
                break
            node_id, target = instead or self._current()
            instead = None
            stub = self._stub(target)
            attempt_s = left_s if cap_s is None else min(cap_s, left_s)
            try:
                response = await pick(stub)(request, timeout=attempt_s)
            except grpc.aio.AioRpcError as err:
                refused = refusal(err)
                if refused is not None:
                    raise refused from None
                last_error = f"{self._name(node_id)} at {target}: {err.code().name} {err.details()}"
                if err.code() is grpc.StatusCode.UNIMPLEMENTED:
                    answered = True
                    not_controllers.append(target)
                    self._forget(target, failed=True)
                    self._retrying(f"{last_error}; trying the next controller")
                    continue
                if not idempotent and not _nothing_sent(err):
                    raise OutcomeUnknown(f"{last_error}; the request may have been applied") from err
                timed_out = err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                if timed_out and self._active == (node_id, target):
                    answered = True  # it took the request: slow or black-holed, not unreachable
                if timed_out and self._active == (node_id, target) and self._confirmed:
                    # Slow is not gone: a busy active controller stays the one other calls use; this
                    # call asks another voter, which names the active controller (or is it).
                    instead = self._other_voter(target)
                else:
                    self._forget(target, failed=True)
                self._retrying(f"{last_error}; trying another controller")
                continue
            answered = True
            self._rotation.answered(target)
            if response.error_code == ErrorCode.NOT_CONTROLLER:
                last_error = f"{self._name(node_id)} at {target} is not the active controller"
            elif idempotent and _deposed_answer(response):
                last_error = f"{self._name(node_id)} at {target}: {getattr(response, 'error_message', '')}"
            else:
                self._active, self._confirmed = (node_id, target), True
                return response
            hint = response.controller
            # -1 names no controller: never a bootstrap entry's (their ids are -1 too: unknown)
            known = self._resolve(hint.node_id) if hint.node_id >= 0 else None
            if known is not None and self._moved(hint, known):
                known = None  # the hint's endpoint, learned below
            if known is not None:
                # Resolve the id through our own voter list (as Kafka does): the endpoint in the hint is
                # how the *controllers* reach each other, which need not be how this broker reaches them.
                self._active, self._confirmed = (hint.node_id, known), True
            elif hint.node_id >= 0 and hint.endpoint.port > 0:
                self._active = (hint.node_id, _hint_target(hint))
                self._confirmed = True
                self._learn(*self._active)
            else:
                self._forget(target)
            moved = f"controller {self._active[0]} at {self._active[1]}" if self._active else "the next voter"
            self._retrying(f"{last_error}; resending to {moved}")
        raise ControllerUnavailable(last_error, unreachable=not answered, not_controllers=not_controllers)

    def _retrying(self, line: str) -> None:
        if self._on_retry is not None:
            self._on_retry(line)

    @staticmethod
    def _name(node_id: int) -> str:
        return f"controller {node_id}" if node_id >= 0 else "controller"

    async def alter_partition(
        self, request: cpb.AlterPartitionRequest, timeout_s: float
    ) -> cpb.AlterPartitionResponse:
        """A partition leader's ISR proposal (KIP-497) to the active controller.  Per-partition errors are
        in the answer's ``partitions``; request-level ones (STALE_BROKER_EPOCH, …) in ``error_code``;
        ControllerUnavailable when no controller answered — the caller retries with its own backoff."""
        return await self.call(lambda stub: stub.AlterPartition, request, timeout_s)

    async def close(self) -> None:
        self._stubs = {}
        await self._channels.close()

    def _moved(self, hint: NodeRef, known: str) -> bool:
        """Whether to follow the hint's endpoint rather than ``known``, the learned voter set's address for
        the hinted controller: when that address failed at its last attempt and the hint names another.
        A voter that moved (UpdateRaftVoter) and leads before this client learned the set recording it
        would otherwise be dialled at its old address for as long as it leads (only the active controller
        sends the voter set).  A configured voter's address always wins: it is how this client reaches it."""
        if self._voter_set.get(hint.node_id) != known or not self._rotation.is_failed(known):
            return False
        return hint.endpoint.port > 0 and _hint_target(hint) != known

    def _resolve(self, node_id: int) -> str | None:
        """A controller id's address from the learned voter set (the latest), else the configured voters."""
        return self._voter_set.get(node_id) or self._voter_targets.get(node_id)

    def _learn(self, node_id: int, target: str) -> None:
        """Add a hinted controller that neither the voter set nor the voter list has to the rotation (its
        latest address: a learned controller's address follows the hints, a configured voter's never
        does) — a hint may come from a leader whose voter set is newer than ours."""
        if (
            self._learned.get(node_id) == target
            or target in self._voter_targets.values()
            or target in self._voter_set.values()
        ):
            return
        self._learned.pop(node_id, None)
        if len(self._learned) >= MAX_LEARNED_CONTROLLERS:  # a hint is a peer's word: bounded, oldest out
            del self._learned[next(iter(self._learned))]
        self._learned[node_id] = target
        self._rebuild_rotation()

    def _rebuild_rotation(self) -> None:
        """Before a voter set is known: the configured controllers, then the hinted ones.  Once one is:
        its voters, the hinted controllers it lacks, and the configured ones it lacks as last resorts."""
        if not self._voter_set:
            self._rotation.replace([*self._voters, *self._learned.items()])
            return
        members = list(self._voter_set.items())
        addresses = set(self._voter_set.values())
        members += [(node_id, target) for node_id, target in self._learned.items() if target not in addresses]
        addresses.update(self._learned.values())
        bootstrap = [(node_id, target) for node_id, target in self._voters if target not in addresses]
        self._rotation.replace([*members, *bootstrap], last_resort=[target for _, target in bootstrap])

    def _current(self) -> tuple[int, str]:
        if self._active is None:
            self._active = self._next(avoid=None) or self._voters[0]  # _next(None) always finds one
            self._confirmed = False
        return self._active

    def _other_voter(self, target: str) -> tuple[int, str] | None:
        return self._next(avoid=target)

    def _next(self, avoid: str | None) -> tuple[int, str] | None:
        """The next voter in the rotation other than ``avoid`` that has not failed (kraft.client.rotation)."""
        return self._rotation.next(avoid)

    def _forget(self, target: str, *, failed: bool = False) -> None:
        if self._active is not None and self._active[1] == target:
            self._active, self._confirmed = None, False
        if failed:
            self._rotation.failed(target)

    def _stub(self, target: str) -> ControllerServiceAsyncStub:
        channel = self._channels.get(target)
        cached = self._stubs.get(target)
        if cached is not None and cached[0] is channel:
            return cached[1]
        stub = controller_pb2_grpc.ControllerServiceStub(channel)
        self._stubs[target] = (channel, stub)
        return stub
