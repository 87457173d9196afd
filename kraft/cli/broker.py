"""``kraft broker list | describe ID | unregister ID | shutdown ID`` (admin, through the active controller).

``kraft broker start`` lives in :mod:`kraft.cli.broker_start` and adds itself to :data:`app`.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from kraft.cli.common import (
    DEFAULT_TIMEOUT_S,
    CliError,
    ClusterDirOption,
    CommandConfigOption,
    JsonOption,
    OptionalBootstrapControllerOption,
    TimeoutOption,
    VerboseOption,
    admin_client,
    bootstrap_from,
    handle_errors,
    print_json,
    print_key_values,
    print_table,
    run_async,
)
from kraft.client.admin import AdminClient
from kraft.client.broker import broker_state, describe_broker
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import controller_pb2 as cpb

app = typer.Typer(no_args_is_help=True, help="Brokers: run one, list, describe, unregister, shut down.")

LIST_COLUMNS = [
    "Id",
    "State",
    "Epoch",
    "Rack",
    "Endpoints",
    "MetadataOffset",
    "LastHeartbeatMsAgo",
    "Leaders",
    "Replicas",
]
BrokerIdArgument = Annotated[int, typer.Argument(help="The broker's node.id.", show_default=False)]
# The broker-side state is a best-effort extra on `describe`: a dead or hung broker must not stall it.
BROKER_STATE_TIMEOUT_S = 2.0
UNKNOWN_STATE = "unknown"


def _client(bootstrap: str, verbose: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> AdminClient:
    return admin_client(bootstrap, timeout_s, verbose)


def broker_json(broker: cpb.BrokerDescription) -> dict[str, Any]:
    """The ``broker list --json`` object (ARCHITECTURE.md §7)."""
    return {
        "id": broker.broker_id,
        "epoch": broker.broker_epoch,
        "incarnation_id": broker.incarnation_id,
        "state": broker.state,
        "rack": broker.rack if broker.HasField("rack") else None,
        "endpoints": [f"{e.name}://{e.host}:{e.port}" for e in broker.endpoints],
        "metadata_offset": broker.metadata_offset,
        "last_heartbeat_ms_ago": broker.last_heartbeat_ms_ago if broker.last_heartbeat_ms_ago >= 0 else None,
        "leaders": broker.leader_count,
        "replicas": broker.replica_count,
    }


async def _describe_cluster(
    bootstrap: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> cpb.DescribeClusterResponse:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        return await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())


@app.command("list")
@handle_errors
def list_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    as_json: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """Every registered broker with its state (FENCED, ACTIVE, CONTROLLED_SHUTDOWN, OFFLINE).

    Examples:

      kraft broker list --bootstrap-controller 127.0.0.1:9093

      kraft broker list --bootstrap-controller 127.0.0.1:9093,127.0.0.1:9094

      kraft broker list --bootstrap-controller 127.0.0.1:9093 --json
    """
    cluster = run_async(
        _describe_cluster(bootstrap_from(bootstrap_controller, cluster_dir), timeout_s=timeout)
    )
    brokers = [broker_json(b) for b in cluster.brokers]
    if as_json:
        print_json(brokers)
        return
    print_table(
        LIST_COLUMNS,
        [
            [
                b["id"], b["state"], b["epoch"], b["rack"], ",".join(b["endpoints"]), b["metadata_offset"],
                b["last_heartbeat_ms_ago"], b["leaders"], b["replicas"],
            ]
            for b in brokers
        ],
    )  # fmt: skip


def client_endpoint(broker: cpb.BrokerDescription) -> str | None:
    """``host:port`` of the broker's client listener (PLAINTEXT when present, else its first one)."""
    endpoints = sorted(broker.endpoints, key=lambda e: e.name != "PLAINTEXT")
    if not endpoints:
        return None
    host = endpoints[0].host or "127.0.0.1"
    if host in ("0.0.0.0", "::"):  # a wildcard bind is reachable on loopback from this host only
        host = "127.0.0.1"
    return f"[{host}]:{endpoints[0].port}" if ":" in host else f"{host}:{endpoints[0].port}"


async def broker_side_state(
    target: str | None, cluster_id: str, timeout_s: float = BROKER_STATE_TIMEOUT_S
) -> str:
    """The broker's own lifecycle state (STARTING … SHUTTING_DOWN) from its DescribeBroker RPC, or
    ``unknown`` when it cannot be asked (no endpoint, unreachable, timeout, error answer — e.g. the
    endpoint now belongs to another cluster's broker)."""
    if target is None:
        return UNKNOWN_STATE
    response = await broker_state(target, cluster_id, timeout_s)
    if response is None or response.error_code != 0 or not response.state:
        return UNKNOWN_STATE
    return response.state


async def _describe_broker(
    bootstrap: str, broker_id: int, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        cluster = await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
        found = [b for b in cluster.brokers if b.broker_id == broker_id]
        if not found:
            raise CliError(f"BROKER_ID_NOT_REGISTERED: broker {broker_id} is not registered")
        topics = await client.call(
            lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest(include_partitions=True)
        )
    result = broker_json(found[0])
    target = client_endpoint(found[0])
    own = (
        None if target is None else await describe_broker(target, cluster.cluster_id, BROKER_STATE_TIMEOUT_S)
    )
    if own is None or own.error_code != 0:
        own = None
    result["broker_state"] = own.state if own is not None and own.state else UNKNOWN_STATE
    # Log dirs the broker took offline (I/O or corruption error): None when it cannot be asked.
    result["offline_log_dirs"] = None if own is None else list(own.offline_log_dirs)
    # What the broker itself reports per partition (log end, high watermark, lag): None when it cannot be
    # asked — the controller's view (leader, ISR) is shown anyway.
    local = {} if own is None else {(p.topic, p.partition): p for p in own.partitions}
    result["partitions"] = [
        {
            "topic": topic.name,
            "partition": p.partition,
            "role": "leader" if p.leader == broker_id else "follower",
            "leader": p.leader,
            "leader_epoch": p.leader_epoch,
            "replicas": list(p.replicas),
            "isr": list(p.isr),
            "in_sync": broker_id in p.isr,
            **_local_progress(local.get((topic.name, p.partition))),
        }
        for topic in topics.topics
        for p in topic.partitions
        if broker_id in p.replicas
    ]
    return result


def _local_progress(p: pb.DescribeBrokerResponse.LocalPartition | None) -> dict[str, Any]:
    """The broker's own numbers for one partition (None values: not known / not asked)."""
    if p is None:
        return {"log_end_offset": None, "high_watermark": None, "lag": None, "followers": None}
    return {
        "log_end_offset": p.log_end_offset,
        "high_watermark": p.high_watermark if p.high_watermark >= 0 else None,
        "lag": p.lag if p.lag >= 0 else None,
        "followers": [
            {
                "broker_id": f.broker_id,
                "log_end_offset": f.log_end_offset if f.log_end_offset >= 0 else None,
                "lag": f.lag if f.lag >= 0 else None,
                "in_isr": f.in_isr,
            }
            for f in p.followers
        ]
        if p.role == "LEADER"
        else None,
    }


def _lag_text(p: dict[str, Any]) -> str:
    """A follower's own lag; a leader's followers' lags as ``id:lag`` (``?`` unknown)."""
    if p["followers"] is not None:
        return ",".join(f"{f['broker_id']}:{'?' if f['lag'] is None else f['lag']}" for f in p["followers"])
    return "?" if p["lag"] is None else str(p["lag"])


@app.command("describe")
@handle_errors
def describe_command(
    broker_id: BrokerIdArgument,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    as_json: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """One broker's registration, state and the partitions it hosts.

    ``State`` is what the controller says (FENCED, ACTIVE, CONTROLLED_SHUTDOWN, OFFLINE); ``BrokerState``
    is the broker's own lifecycle state (STARTING, RECOVERY, RUNNING, PENDING_CONTROLLED_SHUTDOWN,
    SHUTTING_DOWN), asked from the broker itself — ``unknown`` when it does not answer within 2 s.
    Per partition the broker also reports its log end (``LogEnd``), the high watermark (``Hwm``: the
    leader's, or what a follower learned) and ``Lag`` in records: a follower's lag behind its leader's log
    end at its last fetch; on a leader, every follower's as ``broker:lag`` (``?`` = not known yet).
    ``OfflineLogDirs`` lists the log dirs the broker took offline after an I/O or corruption error, with
    the error; they stay offline until the broker is restarted (docs/operations.md, "A log dir failed").

    Examples:

      kraft broker describe --bootstrap-controller 127.0.0.1:9093 101

      kraft broker describe --bootstrap-controller 127.0.0.1:9093 101 --json
    """
    broker = run_async(
        _describe_broker(bootstrap_from(bootstrap_controller, cluster_dir), broker_id, timeout_s=timeout)
    )
    if as_json:
        print_json(broker)
        return
    print_key_values(
        [
            ("Id", broker["id"]),
            ("State", broker["state"]),
            ("BrokerState", broker["broker_state"]),
            ("Epoch", broker["epoch"]),
            ("IncarnationId", broker["incarnation_id"]),
            ("Rack", broker["rack"]),
            ("Endpoints", ",".join(broker["endpoints"])),
            ("MetadataOffset", broker["metadata_offset"]),
            ("LastHeartbeatMsAgo", broker["last_heartbeat_ms_ago"]),
            ("OfflineLogDirs", _offline_text(broker["offline_log_dirs"])),
        ]
    )
    print_table(
        ["Topic", "Partition", "Role", "Leader", "LeaderEpoch", "Replicas", "Isr", "LogEnd", "Hwm", "Lag"],
        [
            [
                p["topic"],
                p["partition"],
                p["role"],
                p["leader"],
                p["leader_epoch"],
                p["replicas"],
                p["isr"],
                _or_unknown(p["log_end_offset"]),
                _or_unknown(p["high_watermark"]),
                _lag_text(p),
            ]
            for p in broker["partitions"]
        ],
    )


def _offline_text(dirs: list[str] | None) -> str:
    """``none``, ``?`` (the broker did not answer) or the dirs with their errors, ``; ``-separated."""
    if dirs is None:
        return "?"
    return "; ".join(dirs) if dirs else "none"


def _or_unknown(value: object) -> object:
    return "?" if value is None else value


async def _unregister(
    bootstrap: str, broker_id: int, verbose: bool, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    async with _client(bootstrap, verbose, timeout_s) as client:
        await client.unregister_broker(cpb.UnregisterBrokerRequest(broker_id=broker_id))


@app.command("unregister")
@handle_errors
def unregister_command(
    broker_id: BrokerIdArgument,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Remove a broker's registration (kafka-cluster.sh unregister); its id becomes free.

    Examples:

      kraft broker unregister --bootstrap-controller 127.0.0.1:9093 103

      kraft broker unregister --bootstrap-controller 127.0.0.1:9093 103 --json
    """
    run_async(
        _unregister(bootstrap_from(bootstrap_controller, cluster_dir), broker_id, verbose, timeout_s=timeout)
    )
    if as_json:
        print_json({"id": broker_id, "result": "unregistered"})
    else:
        typer.echo(f"broker {broker_id} unregistered")


async def _shutdown(
    bootstrap: str, broker_id: int, verbose: bool, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int:
    async with _client(bootstrap, verbose, timeout_s) as client:
        # Idempotent: a resend asks for the shutdown that is already under way.
        response = await client.call(
            lambda s: s.ShutdownBroker, cpb.ShutdownBrokerRequest(broker_id=broker_id)
        )
        return response.leaderships_remaining


@app.command("shutdown")
@handle_errors
def shutdown_command(
    broker_id: BrokerIdArgument,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Controlled shutdown: move the broker's leaderships away, then tell it to stop at its next heartbeat.

    Examples:

      kraft broker shutdown --bootstrap-controller 127.0.0.1:9093 102

      kraft broker shutdown --bootstrap-controller 127.0.0.1:9093 102 --json
    """
    remaining = run_async(
        _shutdown(bootstrap_from(bootstrap_controller, cluster_dir), broker_id, verbose, timeout_s=timeout)
    )
    if as_json:
        print_json({"id": broker_id, "result": "controlled_shutdown", "leaderships_remaining": remaining})
    else:
        typer.echo(f"broker {broker_id} is in controlled shutdown ({remaining} leaderships left)")


# `kraft broker start` registers itself on this app; it needs the broker runtime, imported last.
importlib.import_module("kraft.cli.broker_start")
