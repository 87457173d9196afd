"""Admin calls to the active controller for tools (CLI, tests, benchmarks).

Wraps :class:`kraft.client.controller.ControllerClient` (which follows NOT_CONTROLLER redirects)
with the retry pacing a tool wants: keep trying the bootstrap list until a deadline, so a command issued
during a leader election simply waits for the new active controller.  Three failures end a call early,
because waiting cannot fix them:

* every bootstrap address refuses connections for ``unreachable_timeout_s`` → :class:`ControllerUnreachable`
  naming the addresses tried (a dead or mistyped ``--bootstrap-controller``);
* every address answers gRPC but serves no ControllerService → :class:`NotAController` (a broker's
  address, which it names as one when the node answers DescribeBroker);
* a non-idempotent write whose outcome is unknown (kraft.errors) → :class:`WriteOutcomeUnknown`, never
  resent blindly.  :meth:`create_topics`, :meth:`delete_topics` and :meth:`unregister_broker` resend it
  and reconcile the answer: a topic that now exists exactly as requested was created by the first attempt,
  a topic (broker) that is gone was deleted (unregistered) by it.

Time, as Kafka's admin client splits it: ``timeout_s`` (``default.api.timeout.ms``; the CLI's ``--timeout``)
bounds one whole operation — learning the cluster id, every round, backoff, resend and reconciliation
included — and ``attempt_timeout_s`` (``request.timeout.ms``) one RPC, so a black-holed bootstrap address
costs one attempt and the next address is asked.  No round starts with less than
:data:`kraft.client.controller.MIN_ATTEMPT_S` of the deadline left (before session 16 each round got at
least 0.5 s, so a call could end up to 0.5 s late).

``on_retry`` receives one line per retry (the CLI's ``--verbose``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kraft.client import rotation
from kraft.client.broker import broker_state
from kraft.client.channel import ChannelPool
from kraft.client.controller import (
    MIN_ATTEMPT_S,
    ControllerClient,
    ControllerUnavailable,
    MethodPicker,
    OutcomeUnknown,
    ResponseT,
)
from kraft.clock import Clock
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb

UNREACHABLE_TIMEOUT_S = rotation.UNREACHABLE_TIMEOUT_S
"""How long every bootstrap address may refuse connections before a call gives up (a controller that
restarts is back within this; an election with reachable controllers is waited out up to ``timeout_s``).
The same limit as the other CLI clients' (kraft.client.rotation)."""
_PROBE_TIMEOUT_S = 1.0
_RECONCILE_ATTEMPTS = 3
ADMIN_RETRY_BACKOFF_S = 0.05
"""The first pause between an operation's rounds when ``retry.backoff.ms`` is not set: the admin client's
pause before the key was honoured (session 19), kept so the default behaviour did not change."""
ADMIN_RETRY_BACKOFF_MAX_S = 1.0
"""Kafka's ``retry.backoff.max.ms`` default: the doubling pause stops growing here."""


class ControllerUnreachable(KraftError):
    """No bootstrap address accepted a connection."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message)

    def __str__(self) -> str:
        return self.message


class NotAController(KraftError):
    """Every bootstrap address is a gRPC server without ControllerService (e.g. a broker)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)

    def __str__(self) -> str:
        return self.message


class DeadlinePassed(KraftError):
    """The operation's ``timeout_s`` ran out before an active controller answered (NOT_CONTROLLER, as
    before this class: scripts match on that code)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NOT_CONTROLLER, message)


class WriteOutcomeUnknown(KraftError):
    """The write may or may not have been applied (REQUEST_TIMED_OUT; see kraft.errors)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message)


class AdminClient:
    def __init__(
        self,
        targets: Sequence[str],
        timeout_s: float = 15.0,
        attempt_timeout_s: float | None = None,
        *,
        clock: Clock,
        unreachable_timeout_s: float = UNREACHABLE_TIMEOUT_S,
        on_retry: Callable[[str], None] | None = None,
        cluster_id: str = "",
        channels: ChannelPool | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        first_target: int = 0,
        retry_backoff_s: float = ADMIN_RETRY_BACKOFF_S,
    ) -> None:
        """``timeout_s`` bounds a whole operation (retries, resends and reconciliation included);
        ``attempt_timeout_s`` one RPC (default: whatever is left of the operation's budget — bulk requests
        can take long to commit; the CLI passes ``request.timeout.ms``).  ``clock`` measures the deadline.
        Every request is sent with ``cluster_id`` (the controllers refuse an empty one); when it is empty
        the client learns it first from DescribeCluster, which states the cluster id even when it refuses
        the request.  ``channels`` and ``sleep`` (the backoff between rounds) let tests run it on a manual
        clock.  ``first_target``: the index in ``targets`` asked first (the CLI's is random, so a dead first
        address does not cost every command one attempt; :func:`kraft.cli.common.admin_client`).
        ``retry_backoff_s``: the first pause between rounds, doubled each round up to
        :data:`ADMIN_RETRY_BACKOFF_MAX_S` (or itself when larger) — Kafka's ``retry.backoff.ms`` and
        ``retry.backoff.max.ms``; the CLI passes the client properties' ``retry.backoff.ms``."""
        if not targets:
            raise ValueError("at least one controller endpoint is needed")
        self._targets = list(targets)
        # The attempt timeout is the controller client's request timeout; each call below passes what is
        # left of this call's deadline, which its redirects and resends share (no call overruns it).
        self._client = ControllerClient(
            [(-1, t) for t in targets],
            on_retry=on_retry,
            request_timeout_s=attempt_timeout_s,
            clock=clock,
            channels=channels,
            first_voter=first_target,
        )
        self._clock = clock
        self._sleep = sleep
        self._retry_backoff_s = retry_backoff_s
        self._on_retry = on_retry
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.unreachable_timeout_s = unreachable_timeout_s
        self._cluster_id = cluster_id

    @property
    def targets(self) -> list[str]:
        """The controller endpoints it was given."""
        return list(self._targets)

    @property
    def controller_client(self) -> ControllerClient:
        """The client its calls go through (bench.controller_fleet opens heartbeat streams on it)."""
        return self._client

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    def deadline_ms(self) -> float:
        """The deadline (``clock`` ms) of an operation that starts now: ``timeout_s`` from now."""
        return self._clock.monotonic_ms() + self.timeout_s * 1000

    async def cluster_id(self, deadline_ms: float | None = None) -> str:
        """The cluster the controllers belong to (given, or learned once from DescribeCluster)."""
        if not self._cluster_id:
            response = await self._call(
                lambda s: s.DescribeCluster,
                cpb.DescribeClusterRequest(),
                check=False,
                idempotent=True,
                deadline_ms=self.deadline_ms() if deadline_ms is None else deadline_ms,
            )
            if not response.cluster_id:
                raise KraftError(
                    ErrorCode.INCONSISTENT_CLUSTER_ID, "the controller did not state its cluster id"
                )
            self._cluster_id = response.cluster_id
        return self._cluster_id

    async def call(
        self,
        pick: MethodPicker[ResponseT],
        request: Any,
        check: bool = True,
        *,
        idempotent: bool = True,
        deadline_ms: float | None = None,
        active_timed_out: bool = False,
    ) -> ResponseT:
        """The active controller's answer; with ``check`` a non-NONE top-level error raises KraftError.

        A request whose ``cluster_id`` is empty gets this client's (set in place).  A request that is not
        ``idempotent`` is never resent once it may have been applied: a deadline after sending it, or a
        REQUEST_TIMED_OUT answer, raises :class:`WriteOutcomeUnknown`.  ``deadline_ms``: the deadline of
        the operation this call is part of (default: :meth:`deadline_ms`, ``timeout_s`` from now).
        ``active_timed_out``: the last attempt at the controller believed active ran out; the first attempt
        asks another controller (which names the active one, or is it), so a black-holed controller is not
        asked again first (:meth:`kraft.client.controller.ControllerClient.call`)."""
        if deadline_ms is None:
            deadline_ms = self.deadline_ms()
        if not request.cluster_id:
            request.cluster_id = await self.cluster_id(deadline_ms)
        return await self._call(
            pick,
            request,
            check,
            idempotent=idempotent,
            deadline_ms=deadline_ms,
            active_timed_out=active_timed_out,
        )

    async def _call(
        self,
        pick: MethodPicker[ResponseT],
        request: Any,
        check: bool,
        *,
        idempotent: bool,
        deadline_ms: float,
        active_timed_out: bool = False,
    ) -> ResponseT:
        backoff_s = self._retry_backoff_s
        max_backoff_s = max(ADMIN_RETRY_BACKOFF_MAX_S, backoff_s)
        unreachable_since_ms: float | None = None
        last_error = "no round was started"
        while True:
            remaining = (deadline_ms - self._clock.monotonic_ms()) / 1000
            if remaining < MIN_ATTEMPT_S:
                # Spent by an earlier part of this operation (the cluster id, a resend) or by the backoff
                # sleep's lateness: a round this short only adds load, and Kafka fails the call here too.
                raise self._deadline_passed(last_error)
            elsewhere, active_timed_out = active_timed_out, False  # the first round only
            try:
                # Every redirect and resend of the round shares what is left; each RPC gets at most
                # attempt_timeout_s (the inner client's request timeout), so the round ends by the deadline.
                response = await self._client.call(
                    pick, request, timeout_s=remaining, idempotent=idempotent, active_timed_out=elsewhere
                )
            except OutcomeUnknown as exc:
                raise WriteOutcomeUnknown(str(exc)) from None
            except ControllerUnavailable as exc:
                now_ms = self._clock.monotonic_ms()
                last_error = str(exc)
                if exc.not_controllers and set(exc.not_controllers) >= set(self._targets):
                    probe_s = max(MIN_ATTEMPT_S, min(_PROBE_TIMEOUT_S, (deadline_ms - now_ms) / 1000))
                    raise NotAController(
                        await self._not_a_controller(exc.not_controllers[0], probe_s)
                    ) from None
                if exc.unreachable:
                    unreachable_since_ms = now_ms if unreachable_since_ms is None else unreachable_since_ms
                    if now_ms - unreachable_since_ms >= self.unreachable_timeout_s * 1000:
                        raise ControllerUnreachable(
                            f"no controller reachable at {','.join(self._targets)} for "
                            f"{self.unreachable_timeout_s:g}s ({exc}); is --bootstrap-controller right "
                            "and is a controller running there?"
                        ) from None
                else:
                    unreachable_since_ms = None
                if now_ms + (backoff_s + MIN_ATTEMPT_S) * 1000 > deadline_ms:
                    raise self._deadline_passed(last_error) from None
                self._retrying(f"{exc}; retrying in {backoff_s:g}s")
                await self._sleep(backoff_s)
                backoff_s = min(backoff_s * 2, max_backoff_s)
                continue
            code = ErrorCode.from_wire(response.error_code)
            if not idempotent and code is ErrorCode.REQUEST_TIMED_OUT:
                raise WriteOutcomeUnknown(getattr(response, "error_message", "") or code.name)
            if check and code != ErrorCode.NONE:
                raise KraftError(code, getattr(response, "error_message", "") or code.name)
            return response

    def _deadline_passed(self, last_error: str) -> DeadlinePassed:
        attempt = (
            "" if self.attempt_timeout_s is None else f", each attempt at most {self.attempt_timeout_s:g}s"
        )
        return DeadlinePassed(
            f"no active controller answered within {self.timeout_s:g}s{attempt}: {last_error}"
        )

    # ---- ACLs (kraft acl add|list|remove) ----

    async def create_acls(self, bindings: Sequence[cpb.AclBinding]) -> cpb.CreateAclsResponse:
        """Per-binding results in ``results`` (an invalid binding fails alone: check each)."""
        request = cpb.CreateAclsRequest(creations=bindings)
        return await self.call(lambda stub: stub.CreateAcls, request)

    async def describe_acls(self, acl_filter: cpb.AclFilter) -> list[cpb.AclDescription]:
        response = await self.call(lambda stub: stub.DescribeAcls, cpb.DescribeAclsRequest(filter=acl_filter))
        return list(response.acls)

    async def delete_acls(self, filters: Sequence[cpb.AclFilter]) -> cpb.DeleteAclsResponse:
        """Per-filter results in ``filter_results``, each listing the ACLs it deleted."""
        return await self.call(lambda stub: stub.DeleteAcls, cpb.DeleteAclsRequest(filters=filters))

    # --- non-idempotent writes, reconciled after an unknown outcome -------------------------------

    async def create_topics(self, request: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        """CreateTopics; after an unknown outcome it is resent, and TOPIC_ALREADY_EXISTS for a topic whose
        partitions, replicas and configs are exactly those requested counts as created (by the first
        attempt — or, indistinguishably, by another client creating the same topic at the same time)."""
        if request.validate_only:
            return await self.call(lambda s: s.CreateTopics, request)
        deadline_ms = self.deadline_ms()
        response, resent = await self._send(lambda s: s.CreateTopics, request, "CreateTopics", deadline_ms)
        if not resent:
            return response
        existing = [r.name for r in response.topics if r.error_code == ErrorCode.TOPIC_ALREADY_EXISTS]
        if not existing:
            return response
        described = await self.call(
            lambda s: s.DescribeTopics,
            cpb.DescribeTopicsRequest(names=existing, include_partitions=True),
            deadline_ms=deadline_ms,
        )
        found = {t.name: t for t in described.topics if t.error_code == ErrorCode.NONE}
        wanted = {t.name: t for t in request.topics}
        for result in response.topics:
            topic = found.get(result.name)
            if result.error_code != ErrorCode.TOPIC_ALREADY_EXISTS or topic is None:
                continue
            if matches_spec(wanted[result.name], topic):
                self._retrying(
                    f"topic {result.name} exists exactly as requested: created by the first attempt"
                )
                result.error_code = ErrorCode.NONE
                result.error_message = ""
                result.topic_id = topic.topic_id
                result.num_partitions = len(topic.partitions)
                result.replication_factor = len(topic.partitions[0].replicas) if topic.partitions else 0
        return response

    async def delete_topics(self, request: cpb.DeleteTopicsRequest) -> cpb.DeleteTopicsResponse:
        """DeleteTopics; after an unknown outcome it is resent, and a topic that is gone by then counts as
        deleted (the first attempt appended its deletion, so it existed)."""
        response, resent = await self._send(
            lambda s: s.DeleteTopics, request, "DeleteTopics", self.deadline_ms()
        )
        if not resent:
            return response
        for result in response.topics:
            if result.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self._retrying(f"topic {result.name} is gone: deleted by the first attempt")
                result.error_code = ErrorCode.NONE
                result.error_message = ""
        return response

    async def create_partitions(self, request: cpb.CreatePartitionsRequest) -> cpb.CreatePartitionsResponse:
        """CreatePartitions; after an unknown outcome it is resent, and INVALID_PARTITIONS for a topic that
        now has exactly the requested count counts as done (by the first attempt)."""
        if request.validate_only:
            return await self.call(lambda s: s.CreatePartitions, request)
        deadline_ms = self.deadline_ms()
        response, resent = await self._send(
            lambda s: s.CreatePartitions, request, "CreatePartitions", deadline_ms
        )
        if not resent:
            return response
        wanted = {t.name: t.count for t in request.topics}
        refused = [r.name for r in response.topics if r.error_code == ErrorCode.INVALID_PARTITIONS]
        if not refused:
            return response
        described = await self.call(
            lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest(names=refused), deadline_ms=deadline_ms
        )
        counts = {t.name: len(t.partitions) for t in described.topics if t.error_code == ErrorCode.NONE}
        for result in response.topics:
            if (
                result.error_code == ErrorCode.INVALID_PARTITIONS
                and counts.get(result.name) == wanted[result.name]
            ):
                self._retrying(
                    f"topic {result.name} has {wanted[result.name]} partitions: grown by the first attempt"
                )
                result.error_code = ErrorCode.NONE
                result.error_message = ""
        return response

    async def describe_configs(
        self, resources: Sequence[cpb.DescribeConfigsResource]
    ) -> cpb.DescribeConfigsResponse:
        """Per-resource results (check each ``error_code``)."""
        return await self.call(lambda s: s.DescribeConfigs, cpb.DescribeConfigsRequest(resources=resources))

    async def incremental_alter_configs(
        self, resources: Sequence[cpb.AlterConfigsResource], validate_only: bool = False
    ) -> cpb.IncrementalAlterConfigsResponse:
        """Per-resource results; idempotent (the same SET/DELETE applied twice gives the same configs), so a
        call with an unknown outcome is simply resent.  APPEND/SUBTRACT are not: a request with them is sent
        once."""
        idempotent = all(c.op in (0, 1) for r in resources for c in r.configs)
        request = cpb.IncrementalAlterConfigsRequest(resources=resources, validate_only=validate_only)
        return await self.call(lambda s: s.IncrementalAlterConfigs, request, idempotent=idempotent)

    async def update_features(
        self, updates: Sequence[cpb.FeatureUpdate], validate_only: bool = False
    ) -> cpb.UpdateFeaturesResponse:
        """Per-feature results; idempotent (finalizing the same level twice writes it once), so a call
        with an unknown outcome is simply resent."""
        request = cpb.UpdateFeaturesRequest(updates=updates, validate_only=validate_only)
        return await self.call(lambda s: s.UpdateFeatures, request, idempotent=True)

    async def unregister_broker(self, request: cpb.UnregisterBrokerRequest) -> cpb.UnregisterBrokerResponse:
        """UnregisterBroker (errors raise KraftError); after an unknown outcome it is resent, and
        BROKER_ID_NOT_REGISTERED then means the first attempt unregistered it."""
        response, resent = await self._send(
            lambda s: s.UnregisterBroker, request, "UnregisterBroker", self.deadline_ms(), check=False
        )
        if resent and response.error_code == ErrorCode.BROKER_ID_NOT_REGISTERED:
            self._retrying(f"broker {request.broker_id} is not registered: unregistered by the first attempt")
            return cpb.UnregisterBrokerResponse()
        code = ErrorCode.from_wire(response.error_code)
        if code is not ErrorCode.NONE:
            raise KraftError(code, response.error_message or code.name)
        return response

    async def _send(
        self,
        pick: MethodPicker[ResponseT],
        request: Any,
        what: str,
        deadline_ms: float,
        *,
        check: bool = True,
    ) -> tuple[ResponseT, bool]:
        """The answer, and whether it answers a resend made after an unknown outcome (then the caller
        reconciles it); up to ``_RECONCILE_ATTEMPTS`` resends within ``deadline_ms``, then
        WriteOutcomeUnknown (also when the deadline leaves no time for a resend: the outcome is still
        unknown, whatever stopped the resend)."""
        try:
            return await self.call(
                pick, request, check=check, idempotent=False, deadline_ms=deadline_ms
            ), False
        except WriteOutcomeUnknown as exc:
            unknown = exc
        for attempt in range(_RECONCILE_ATTEMPTS):
            if (deadline_ms - self._clock.monotonic_ms()) / 1000 < MIN_ATTEMPT_S:
                break
            self._retrying(f"{what}: outcome unknown ({unknown.message}); resending (attempt {attempt + 2})")
            try:
                # Ask another controller first: if the unknown outcome was the active one's attempt running
                # out, it may be black-holed (if it is only slow, the other names it: one redirect).
                answer = await self.call(
                    pick,
                    request,
                    check=check,
                    idempotent=False,
                    deadline_ms=deadline_ms,
                    active_timed_out=True,
                )
                return answer, True
            except WriteOutcomeUnknown as exc:
                unknown = exc
            except DeadlinePassed:
                break  # no answer to the resend before the deadline: the outcome is still unknown
        raise unknown

    def _retrying(self, line: str) -> None:
        if self._on_retry is not None:
            self._on_retry(line)

    async def _not_a_controller(self, target: str, probe_s: float) -> str:
        answer = await broker_state(target, "", probe_s)
        if answer is not None:
            return (
                f"{target} is a broker, not a controller: --bootstrap-controller takes the controllers' "
                "addresses (controller.quorum.voters)"
            )
        return (
            f"{target} serves no kraft ControllerService (UNIMPLEMENTED): it is not a controller; "
            "--bootstrap-controller takes the controllers' addresses (controller.quorum.voters)"
        )


def matches_spec(wanted: cpb.CreatableTopic, topic: cpb.TopicDescription) -> bool:
    """True when ``topic`` is what ``wanted`` asked for: partitions and replication factor (-1: any),
    or exactly the explicit replica assignment; every requested config with the requested value."""
    partitions = sorted(topic.partitions, key=lambda p: p.partition)
    if wanted.assignments:
        by_partition = sorted(wanted.assignments, key=lambda a: a.partition)
        if [list(a.broker_ids) for a in by_partition] != [list(p.replicas) for p in partitions]:
            return False
    else:
        if wanted.num_partitions not in (-1, len(partitions)):
            return False
        if wanted.replication_factor != -1 and any(
            len(p.replicas) != wanted.replication_factor for p in partitions
        ):
            return False
    configs = {c.name: c.value for c in topic.configs}
    return all(configs.get(c.name) == c.value for c in wanted.configs)
