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
        cluster_id: str = "",
    ) -> None:
        """``timeout_s`` bounds a whole call (retries included); ``attempt_timeout_s`` one RPC
        (default: whatever is left of the call's budget — bulk requests can take long to commit).
        ``clock`` measures the call's deadline.  Every request is sent with ``cluster_id`` (the
        controllers refuse an empty one); when it is empty the client learns it first from
        DescribeCluster, which states the cluster id even when it refuses the request."""
        if not targets:
            raise ValueError("at least one controller endpoint is needed")
        self._client = ControllerClient([(-1, t) for t in targets])
        self._clock = clock
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self._cluster_id = cluster_id

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
                lambda s: s.DescribeCluster, cpb.DescribeClusterRequest(), check=False
            )
            if not response.cluster_id:
                raise KraftError(
                    ErrorCode.INCONSISTENT_CLUSTER_ID, "the controller did not state its cluster id"
                )
            self._cluster_id = response.cluster_id
        return self._cluster_id

    async def call(self, pick: MethodPicker[ResponseT], request: Any, check: bool = True) -> ResponseT:
        """The active controller's answer; with ``check`` a non-NONE top-level error raises KraftError.

        A request whose ``cluster_id`` is empty gets this client's (set in place)."""
        if not request.cluster_id:
            request.cluster_id = await self.cluster_id()
        return await self._call(pick, request, check)

    async def _call(self, pick: MethodPicker[ResponseT], request: Any, check: bool) -> ResponseT:
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
