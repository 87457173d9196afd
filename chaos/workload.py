"""The topic workload: concurrent clients creating, deleting and describing a few topic names.

Each client is a Jepsen *process*: one operation in flight, every invocation and completion recorded in
the history.  Requests go to the controller the client believes is active (NOT_CONTROLLER hints update
that belief by node id, and the client dials that node through its own ``client_to_<node>`` proxy, never
the endpoint in the hint).

Outcome rules — when in doubt, ``info`` (unknown), never ``fail``:
* a gRPC error (deadline, unavailable, reset) → ``info``: the request may have been applied;
* REQUEST_TIMED_OUT → ``info``: a controller that appended the records and then lost leadership (or whose
  write did not commit in time) answers it, and those records may still commit; NOT_CONTROLLER promises
  that nothing was done (kraft.errors) but is kept ``info`` too, the conservative reading;
* NONE → ``ok`` "created"/"deleted"; TOPIC_ALREADY_EXISTS → ``ok`` "exists";
  UNKNOWN_TOPIC_OR_PARTITION → ``ok`` "not_found";
* any other error code is a validation failure before anything was appended → ``fail``.
After an ``info`` the client continues as a new process id (the old one may still be "executing").
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from chaos.history import EventType, HistoryStore
from kraft.client.channel import open_channel
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2, controller_pb2_grpc

INDETERMINATE_CODES = frozenset({ErrorCode.NOT_CONTROLLER, ErrorCode.REQUEST_TIMED_OUT})


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    clients: int = 4
    keys: int = 6
    op_timeout_s: float = 2.0
    pause_s: tuple[float, float] = (0.02, 0.15)  # think time between a client's operations
    replication_factor: int = 1
    partitions: int = 1
    read_fraction: float = 0.2
    info_backoff_s: float = 0.2  # extra pause after an unknown outcome: do not hammer a node that is down


@dataclass(frozen=True, slots=True)
class Completion:
    outcome: EventType
    result: Any = None
    error: str | None = None


def topic_name(index: int) -> str:
    return f"chaos-topic-{index}"


class TopicWorkload:
    """Runs ``options.clients`` concurrent clients against the controllers until a deadline."""

    def __init__(
        self,
        store: HistoryStore,
        cluster_id: str,
        controller_targets: Mapping[int, str],
        seed: int,
        options: WorkloadOptions | None = None,
        initial_leader: int | None = None,
    ) -> None:
        self._store = store
        self._cluster_id = cluster_id
        self._targets = dict(controller_targets)
        self._rng = random.Random(seed)
        self.options = options or WorkloadOptions()
        self._channels: dict[int, grpc.aio.Channel] = {}
        # Starting at the known leader avoids a burst of NOT_CONTROLLER answers, which count as info.
        self._leader: int | None = initial_leader
        self._next_process = 0
        self.keys = [topic_name(i) for i in range(self.options.keys)]

    def _new_process(self) -> int:
        process, self._next_process = self._next_process, self._next_process + 1
        return process

    def _stub(self, node_id: int) -> Any:
        channel = self._channels.get(node_id)
        if channel is None:
            channel = open_channel(self._targets[node_id], options=[("grpc.enable_retries", 0)])
            self._channels[node_id] = channel
        return controller_pb2_grpc.ControllerServiceStub(channel)

    def pick_controller(self) -> int:
        """The controller the next request goes to: the believed leader, else a random one."""
        if self._leader is not None and self._leader in self._targets:
            return self._leader
        return self._rng.choice(sorted(self._targets))

    def _learn_leader(self, controller: Any) -> None:
        node_id = int(controller.node_id)
        self._leader = node_id if node_id in self._targets else None

    async def run(self, duration_s: float) -> None:
        deadline = time.monotonic() + duration_s
        try:
            await asyncio.gather(*(self._client(deadline) for _ in range(self.options.clients)))
        finally:
            await self.close()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close(None)

    async def _client(self, deadline: float) -> None:
        process = self._new_process()
        while time.monotonic() < deadline:
            f, key = self._choose_op()
            invoked = await self._store.invoke(process, f, key)
            done = await self._execute(f, key)
            await self._store.complete(invoked.op_id, done.outcome, done.result, done.error)
            pause = self._rng.uniform(*self.options.pause_s)
            if done.outcome is EventType.INFO:
                process = self._new_process()
                pause += self.options.info_backoff_s
            await asyncio.sleep(pause)

    def _choose_op(self) -> tuple[str, str]:
        key = self._rng.choice(self.keys)
        draw = self._rng.random()
        if draw < self.options.read_fraction:
            return "read", key
        return ("create" if self._rng.random() < 0.5 else "delete"), key

    async def _execute(self, f: str, key: str) -> Completion:
        node_id = self.pick_controller()
        stub = self._stub(node_id)
        timeout = self.options.op_timeout_s
        try:
            if f == "create":
                topic = controller_pb2.CreatableTopic(
                    name=key,
                    num_partitions=self.options.partitions,
                    replication_factor=self.options.replication_factor,
                )
                response = await stub.CreateTopics(
                    controller_pb2.CreateTopicsRequest(cluster_id=self._cluster_id, topics=[topic]),
                    timeout=timeout,
                )
            elif f == "delete":
                response = await stub.DeleteTopics(
                    controller_pb2.DeleteTopicsRequest(cluster_id=self._cluster_id, names=[key]),
                    timeout=timeout,
                )
            else:
                response = await stub.DescribeTopics(
                    controller_pb2.DescribeTopicsRequest(cluster_id=self._cluster_id, names=[key]),
                    timeout=timeout,
                )
        except grpc.aio.AioRpcError as err:
            self._leader = None
            return Completion(EventType.INFO, error=f"controller {node_id}: {err.code().name}")
        return self.interpret(f, node_id, response)

    def interpret(self, f: str, node_id: int, response: Any) -> Completion:
        """Map a controller's answer to an outcome (module docstring) and learn the leader from it."""
        top = ErrorCode.from_wire(response.error_code)
        if top is not ErrorCode.NONE:
            if top is ErrorCode.NOT_CONTROLLER:
                self._learn_leader(response.controller)
            elif top is ErrorCode.REQUEST_TIMED_OUT:
                # Leadership lost after the append: the answer names the new controller.
                self._leader = None
                if response.HasField("controller"):
                    self._learn_leader(response.controller)
            outcome = EventType.INFO if top in INDETERMINATE_CODES or f == "read" else EventType.FAIL
            return Completion(outcome, error=f"controller {node_id}: {top.name} {response.error_message}")
        self._leader = node_id
        if not response.topics:
            return Completion(EventType.INFO, error=f"controller {node_id}: empty answer")
        entry = response.topics[0]
        code = ErrorCode.from_wire(entry.error_code)
        return _topic_completion(f, code, entry.error_message)


def _topic_completion(f: str, code: ErrorCode, message: str) -> Completion:
    if f == "read":
        if code is ErrorCode.NONE:
            return Completion(EventType.OK, True)
        if code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            return Completion(EventType.OK, False)
        return Completion(EventType.INFO, error=f"{code.name} {message}")
    if code is ErrorCode.NONE:
        return Completion(EventType.OK, "created" if f == "create" else "deleted")
    if f == "create" and code is ErrorCode.TOPIC_ALREADY_EXISTS:
        return Completion(EventType.OK, "exists")
    if f == "delete" and code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return Completion(EventType.OK, "not_found")
    if code in INDETERMINATE_CODES:
        return Completion(EventType.INFO, error=f"{code.name} {message}")
    return Completion(EventType.FAIL, error=f"{code.name} {message}")


async def describe_all_topics(
    cluster_id: str, target: str, timeout_s: float = 3.0
) -> tuple[int, frozenset[str]] | None:
    """(metadata offset, topic names) from the controller at ``target``; None unless it is active."""
    async with open_channel(target) as channel:
        stub: Any = controller_pb2_grpc.ControllerServiceStub(channel)
        try:
            response = await stub.DescribeTopics(
                controller_pb2.DescribeTopicsRequest(cluster_id=cluster_id), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return None
    if ErrorCode.from_wire(response.error_code) is not ErrorCode.NONE:
        return None
    names: Sequence[str] = [t.name for t in response.topics if t.error_code == 0]
    return int(response.metadata_offset), frozenset(names)
