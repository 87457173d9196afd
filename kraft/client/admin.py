"""Admin calls to the active controller for tools (CLI, tests, benchmarks).

Wraps :class:`kraft.client.controller.ControllerClient` (which follows NOT_CONTROLLER redirects)
with the retry pacing a tool wants: keep trying the bootstrap list until a deadline, so a command issued
during a leader election simply waits for the new active controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from kraft.client.controller import ControllerClient, ControllerUnavailable, MethodPicker, ResponseT
from kraft.clock import Clock
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb


class AdminClient:
    def __init__(
        self,
        targets: Sequence[str],
        timeout_s: float = 15.0,
        attempt_timeout_s: float | None = None,
        *,
        clock: Clock,
    ) -> None:
        """``timeout_s`` bounds a whole call (retries included); ``attempt_timeout_s`` one RPC
        (default: whatever is left of the call's budget — bulk requests can take long to commit).
        ``clock`` measures the call's deadline."""
        if not targets:
            raise ValueError("at least one controller endpoint is needed")
        self._client = ControllerClient([(-1, t) for t in targets])
        self._clock = clock
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def call(self, pick: MethodPicker[ResponseT], request: Any, check: bool = True) -> ResponseT:
        """The active controller's answer; with ``check`` a non-NONE top-level error raises KraftError."""
        deadline_ms = self._clock.monotonic_ms() + self.timeout_s * 1000
        backoff_s = 0.05
        while True:
            remaining = (deadline_ms - self._clock.monotonic_ms()) / 1000
            try:
                attempt_s = (
                    remaining if self.attempt_timeout_s is None else min(remaining, self.attempt_timeout_s)
                )
                response = await self._client.call(pick, request, timeout_s=max(0.5, attempt_s))
            except ControllerUnavailable as exc:
                if self._clock.monotonic_ms() + backoff_s * 1000 > deadline_ms:
                    raise KraftError(
                        ErrorCode.NOT_CONTROLLER,
                        f"no active controller answered within {self.timeout_s:g}s: {exc}",
                    ) from None
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            code = ErrorCode.from_wire(response.error_code)
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
