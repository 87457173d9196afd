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

``on_retry`` receives one line per retry (the CLI's ``--verbose``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from kraft.client.broker import broker_state
from kraft.client.controller import (
    ControllerClient,
    ControllerUnavailable,
    MethodPicker,
    OutcomeUnknown,
    ResponseT,
)
from kraft.clock import Clock
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb

UNREACHABLE_TIMEOUT_S = 3.0
"""How long every bootstrap address may refuse connections before a call gives up (a controller that
restarts is back within this; an election with reachable controllers is waited out up to ``timeout_s``)."""
_PROBE_TIMEOUT_S = 1.0
_RECONCILE_ATTEMPTS = 3


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
    ) -> None:
        """``timeout_s`` bounds a whole call (retries included); ``attempt_timeout_s`` one RPC
        (default: whatever is left of the call's budget — bulk requests can take long to commit).
        ``clock`` measures the call's deadline.  Every request is sent with ``cluster_id`` (the
        controllers refuse an empty one); when it is empty the client learns it first from
        DescribeCluster, which states the cluster id even when it refuses the request."""
        if not targets:
            raise ValueError("at least one controller endpoint is needed")
        self._targets = list(targets)
        # The attempt timeout is the controller client's request timeout; each call below passes what is
        # left of this call's deadline, which its redirects and resends share (no call overruns it).
        self._client = ControllerClient(
            [(-1, t) for t in targets], on_retry=on_retry, request_timeout_s=attempt_timeout_s, clock=clock
        )
        self._clock = clock
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

    async def cluster_id(self) -> str:
        """The cluster the controllers belong to (given, or learned once from DescribeCluster)."""
        if not self._cluster_id:
            response = await self._call(
                lambda s: s.DescribeCluster, cpb.DescribeClusterRequest(), check=False, idempotent=True
            )
            if not response.cluster_id:
                raise KraftError(
                    ErrorCode.INCONSISTENT_CLUSTER_ID, "the controller did not state its cluster id"
                )
            self._cluster_id = response.cluster_id
        return self._cluster_id

    async def call(
        self, pick: MethodPicker[ResponseT], request: Any, check: bool = True, *, idempotent: bool = True
    ) -> ResponseT:
        """The active controller's answer; with ``check`` a non-NONE top-level error raises KraftError.

        A request whose ``cluster_id`` is empty gets this client's (set in place).  A request that is not
        ``idempotent`` is never resent once it may have been applied: a deadline after sending it, or a
        REQUEST_TIMED_OUT answer, raises :class:`WriteOutcomeUnknown`."""
        if not request.cluster_id:
            request.cluster_id = await self.cluster_id()
        return await self._call(pick, request, check, idempotent=idempotent)

    async def _call(
        self, pick: MethodPicker[ResponseT], request: Any, check: bool, *, idempotent: bool
    ) -> ResponseT:
        deadline_ms = self._clock.monotonic_ms() + self.timeout_s * 1000
        backoff_s = 0.05
        unreachable_since_ms: float | None = None
        while True:
            remaining = (deadline_ms - self._clock.monotonic_ms()) / 1000
            try:
                # The 0.5 s floor is older than the deadline sharing: a last round may end that much late.
                response = await self._client.call(
                    pick, request, timeout_s=max(0.5, remaining), idempotent=idempotent
                )
            except OutcomeUnknown as exc:
                raise WriteOutcomeUnknown(str(exc)) from None
            except ControllerUnavailable as exc:
                now_ms = self._clock.monotonic_ms()
                if exc.not_controllers and set(exc.not_controllers) >= set(self._targets):
                    raise NotAController(await self._not_a_controller(exc.not_controllers[0])) from None
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
                if now_ms + backoff_s * 1000 > deadline_ms:
                    raise KraftError(
                        ErrorCode.NOT_CONTROLLER,
                        f"no active controller answered within {self.timeout_s:g}s: {exc}",
                    ) from None
                self._retrying(f"{exc}; retrying in {backoff_s:g}s")
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            code = ErrorCode.from_wire(response.error_code)
            if not idempotent and code is ErrorCode.REQUEST_TIMED_OUT:
                raise WriteOutcomeUnknown(getattr(response, "error_message", "") or code.name)
            if check and code != ErrorCode.NONE:
                raise KraftError(code, getattr(response, "error_message", "") or code.name)
            return response

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
        response, resent = await self._send(lambda s: s.CreateTopics, request, "CreateTopics")
        if not resent:
            return response
        existing = [r.name for r in response.topics if r.error_code == ErrorCode.TOPIC_ALREADY_EXISTS]
        if not existing:
            return response
        described = await self.call(
            lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest(names=existing, include_partitions=True)
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
        response, resent = await self._send(lambda s: s.DeleteTopics, request, "DeleteTopics")
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
        response, resent = await self._send(lambda s: s.CreatePartitions, request, "CreatePartitions")
        if not resent:
            return response
        wanted = {t.name: t.count for t in request.topics}
        refused = [r.name for r in response.topics if r.error_code == ErrorCode.INVALID_PARTITIONS]
        if not refused:
            return response
        described = await self.call(lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest(names=refused))
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
            lambda s: s.UnregisterBroker, request, "UnregisterBroker", check=False
        )
        if resent and response.error_code == ErrorCode.BROKER_ID_NOT_REGISTERED:
            self._retrying(f"broker {request.broker_id} is not registered: unregistered by the first attempt")
            return cpb.UnregisterBrokerResponse()
        code = ErrorCode.from_wire(response.error_code)
        if code is not ErrorCode.NONE:
            raise KraftError(code, response.error_message or code.name)
        return response

    async def _send(
        self, pick: MethodPicker[ResponseT], request: Any, what: str, *, check: bool = True
    ) -> tuple[ResponseT, bool]:
        """The answer, and whether it answers a resend made after an unknown outcome (then the caller
        reconciles it); up to ``_RECONCILE_ATTEMPTS`` resends, then WriteOutcomeUnknown."""
        try:
            return await self.call(pick, request, check=check, idempotent=False), False
        except WriteOutcomeUnknown as exc:
            unknown = exc
        for attempt in range(_RECONCILE_ATTEMPTS):
            self._retrying(f"{what}: outcome unknown ({unknown.message}); resending (attempt {attempt + 2})")
            try:
                return await self.call(pick, request, check=check, idempotent=False), True
            except WriteOutcomeUnknown as exc:
                unknown = exc
        raise unknown

    def _retrying(self, line: str) -> None:
        if self._on_retry is not None:
            self._on_retry(line)

    async def _not_a_controller(self, target: str) -> str:
        answer = await broker_state(target, "", _PROBE_TIMEOUT_S)
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
