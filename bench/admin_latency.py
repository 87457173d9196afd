"""One-client CreateTopics latency next to one-client TestAppend on the same host (issue #17).

The focused A/B for "one-partition CreateTopics p50 ≤ 3 ms at 1 client".  Two fresh 3-controller quorums
run side by side with the shipped defaults and fsync on (a node with ``kraft.test.append.enable`` runs
Raft alone, so TestAppend needs a quorum of its own); in the metadata quorum broker 1 is registered and
heartbeats every 2 s, as in ``bench.controller`` (RF 1 needs one unfenced broker).  After an optional
``--prefill`` (``bench.controller``'s 16-client ``admin_ops`` part, which runs before its one-client part
and leaves thousands of topics), ``--rounds`` alternating windows of

- ``admin``: :func:`bench.controller.admin_ops` with one worker — CreateTopics of one topic, one
  partition, RF 1, back to back, through :class:`kraft.client.admin.AdminClient` (the
  ``admin_ops_one_client`` part of ``python -m bench.controller``);
- ``stub``: the same requests on a bare generated stub to the active controller — what the admin
  client's own per-call work (retry loop, deadline, redirects) adds is ``admin - stub``;
- ``append``: unary ``TestAppend`` of one 256-byte record, back to back (:class:`bench.raft.KraftWriter`,
  the 1-client point of ``python -m bench.raft``) — a bare Raft commit through the same code.

Only one quorum is loaded at a time and both share the machine's load, so ``admin p50 - append p50`` is
what the CreateTopics path costs outside the Raft commit.  ~40 s with ``--prefill 10``; run it under
``flock /tmp/kraft-bench.lock``.

Run: ``python -m bench.admin_latency [--rounds N] [--seconds S] [--prefill S] [--set KEY=VALUE] [--json]
[--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.controller import PROFILE, admin_ops
from bench.controller_fleet import Fleet, percentile
from bench.raft import KraftWriter, closed_loop
from kraft.client.admin import AdminClient
from kraft.client.channel import open_channel
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerQuorum
from kraft.errors import ErrorCode
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc


async def stub_ops(target: str, cluster_id: str, seconds: float, prefix: str) -> dict[str, Any]:
    """One-client CreateTopics on a bare stub to ``target`` (the active controller)."""
    channel = open_channel(target)
    stub = controller_pb2_grpc.ControllerServiceStub(channel)
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            topic = cpb.CreatableTopic(
                name=f"{prefix}-{len(latencies)}", num_partitions=1, replication_factor=1
            )
            request = cpb.CreateTopicsRequest(cluster_id=cluster_id, topics=[topic])
            start = time.monotonic()
            response = await stub.CreateTopics(request, timeout=30)
            latencies.append(time.monotonic() - start)
            if response.error_code != ErrorCode.NONE or response.topics[0].error_code != ErrorCode.NONE:
                raise RuntimeError(f"CreateTopics failed: {response}")
    finally:
        await channel.close(grace=None)
    ms = [v * 1000 for v in latencies]
    return {"ops": len(ms), "p50_ms": round(percentile(ms, 0.5), 2), "p99_ms": round(percentile(ms, 0.99), 2)}


def _summary(rounds: list[dict[str, Any]], key: str) -> float:
    values: list[float] = [r[key] for r in rounds]
    return round(statistics.median(values), 2)


async def _rounds(
    quorum: ControllerQuorum, raw: ControllerQuorum, rounds: int, seconds: float, prefill_s: float
) -> dict[str, Any]:
    prefill: dict[str, Any] = {}
    leader = quorum.nodes[quorum.wait_for_leader(timeout_s=60).node_id]
    targets = [node.target for node in quorum.nodes.values()]
    writer = KraftWriter(raw.nodes[raw.wait_for_leader(timeout_s=60).node_id].target, raw.cluster_id)
    windows: dict[str, list[dict[str, Any]]] = {"admin": [], "stub": [], "append": []}
    try:
        async with AdminClient(targets, timeout_s=30, clock=SystemClock()) as client:
            beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
            fleet = Fleet(client, beats, quorum.cluster_id, interval_s=2.0)
            await fleet.register(1)
            heartbeats = asyncio.create_task(fleet.run_one(1, 0.0))
            try:
                if prefill_s > 0:
                    prefill = await admin_ops(client, prefill_s, workers=16, prefix="prefill")
                # warm-up: channels, the client's cluster id and active controller
                await admin_ops(client, 1.0, workers=1, prefix="warm")
                await closed_loop(writer.write_one, 1, 1.0, 0.0)
                for index in range(rounds):
                    windows["admin"].append(
                        await admin_ops(client, seconds, workers=1, prefix=f"admin{index}")
                    )
                    windows["stub"].append(
                        await stub_ops(leader.target, quorum.cluster_id, seconds, f"stub{index}")
                    )
                    point = await closed_loop(writer.write_one, 1, seconds, 0.0)
                    windows["append"].append(
                        {"ops": point.ops, "p50_ms": round(point.p50_ms, 2), "p99_ms": round(point.p99_ms, 2)}
                    )
            finally:
                fleet.stopped.add(1)
                heartbeats.cancel()
                await asyncio.gather(heartbeats, return_exceptions=True)
                await fleet.close_streams()
                await beats.close()
    finally:
        await writer.close()
    result: dict[str, Any] = {f"{name}_rounds": values for name, values in windows.items()}
    for name, values in windows.items():
        result[f"{name}_p50_ms"] = _summary(values, "p50_ms")
        result[f"{name}_p99_ms"] = _summary(values, "p99_ms")
    result["outside_raft_ms"] = round(result["admin_p50_ms"] - result["append_p50_ms"], 2)
    result["admin_client_ms"] = round(result["admin_p50_ms"] - result["stub_p50_ms"], 2)
    result["prefill"] = prefill
    return result


def run(rounds: int, seconds: float, overrides: dict[str, str], prefill_s: float = 0.0) -> dict[str, Any]:
    load_before = os.getloadavg()
    settings = {**PROFILE, **overrides}
    with (
        tempfile.TemporaryDirectory(prefix="kraft-bench-admin-latency-") as tmp,
        ControllerQuorum(Path(tmp) / "metadata", overrides=settings, test_append=False) as quorum,
        ControllerQuorum(Path(tmp) / "raw", overrides=settings, test_append=True) as raw,
    ):
        quorum.start()
        raw.start()
        result = asyncio.run(_rounds(quorum, raw, rounds, seconds, prefill_s))
    result["load_average_before"] = [round(v, 2) for v in load_before]
    result["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    result["overrides"] = overrides
    return result


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        prog="python -m bench.admin_latency", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating windows of each (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each window (default 3)")
    parser.add_argument(
        "--prefill",
        type=float,
        default=0.0,
        metavar="S",
        help="first run bench.controller's 16-client admin_ops part for S seconds (it runs 10 s)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    args = parser.parse_args(argv)
    overrides: dict[str, str] = {}
    for setting in args.set:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=VALUE, got {setting!r}")
        overrides[key] = value
    started = time.time()
    result = run(args.rounds, args.seconds, overrides, args.prefill)
    result["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    result["prefill_s"] = args.prefill
    if args.json:
        print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    rounds = "/".join(
        str([r["p50_ms"] for r in result[f"{name}_rounds"]]) for name in ("admin", "stub", "append")
    )
    print(
        f"admin(CreateTopics) p50={result['admin_p50_ms']} p99={result['admin_p99_ms']} ms  "
        f"stub p50={result['stub_p50_ms']}  append(TestAppend) p50={result['append_p50_ms']} "
        f"p99={result['append_p99_ms']} ms  outside_raft={result['outside_raft_ms']} ms  "
        f"rounds={rounds}  load={result['load_average_before']}->{result['load_average_after']}  "
        f"took={time.time() - started:.0f}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
