"""``kraft topic create | list | describe | alter | delete | elect-leaders`` through the active controller."""

from __future__ import annotations

import enum
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
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb

app = typer.Typer(
    no_args_is_help=True,
    help="Topics: create, list, describe, alter (add partitions), delete, elect leaders.",
)

TopicArgument = Annotated[str, typer.Argument(help="The topic name.", show_default=False)]


def _client(bootstrap: str, verbose: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> AdminClient:
    return admin_client(bootstrap, timeout_s, verbose)


def parse_configs(items: list[str]) -> list[cpb.TopicConfig]:
    configs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--config {item!r} is not key=value")
        configs.append(cpb.TopicConfig(name=name.strip(), value=value.strip()))
    return configs


def parse_assignment(text: str) -> list[cpb.ReplicaAssignment]:
    """``1:2:3,2:3:1`` → partition 0 on brokers 1,2,3; partition 1 on 2,3,1 (kafka-topics.sh syntax)."""
    assignments = []
    for partition, group in enumerate(text.split(",")):
        try:
            brokers = [int(b) for b in group.split(":")]
        except ValueError:
            raise CliError(
                f"--replica-assignment {text!r}: {group!r} is not broker ids separated by ':'"
            ) from None
        assignments.append(cpb.ReplicaAssignment(partition=partition, broker_ids=brokers))
    return assignments


async def _create(
    bootstrap: str, topic: cpb.CreatableTopic, validate_only: bool, verbose: bool, timeout_s: float
) -> cpb.CreatableTopicResult:
    async with _client(bootstrap, verbose, timeout_s) as client:
        response = await client.create_topics(
            cpb.CreateTopicsRequest(topics=[topic], validate_only=validate_only)
        )
    return response.topics[0]


@app.command("create")
@handle_errors
def create_command(
    name: TopicArgument,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    partitions: Annotated[int, typer.Option("--partitions", "-p", help="-1 = num.partitions.")] = -1,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", "-r", help="-1 = default.replication.factor.")
    ] = -1,
    config: Annotated[list[str] | None, typer.Option("--config", help="key=value (repeatable).")] = None,
    replica_assignment: Annotated[
        str | None,
        typer.Option(
            "--replica-assignment", help="Explicit replicas: 1:2:3,2:3:1 (one group per partition)."
        ),
    ] = None,
    validate_only: Annotated[
        bool, typer.Option("--validate-only", help="Check only; create nothing.")
    ] = False,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="An existing topic is not an error.")
    ] = False,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Create a topic; replicas are spread evenly and rack-aware over the unfenced brokers.

    Examples:

      kraft topic create --bootstrap-controller 127.0.0.1:9093 orders -p 6 -r 3

      kraft topic create --bootstrap-controller 127.0.0.1:9093 orders \\
          --config retention.ms=86400000 --if-not-exists

      kraft topic create --bootstrap-controller 127.0.0.1:9093 pinned \\
          --replica-assignment 101:102,102:103 --validate-only

      kraft topic create --bootstrap-controller 127.0.0.1:9093 orders -p 6 -r 3 --json --verbose

    A create whose outcome is unknown (the controller lost leadership after appending it) is resent;
    the topic then existing exactly as requested counts as created (--verbose shows the retries).
    """
    topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=replication_factor)
    topic.configs.extend(parse_configs(config or []))
    if replica_assignment:
        topic.assignments.extend(parse_assignment(replica_assignment))
        topic.num_partitions = topic.replication_factor = -1
    result = run_async(
        _create(bootstrap_from(bootstrap_controller, cluster_dir), topic, validate_only, verbose, timeout)
    )
    code = ErrorCode.from_wire(result.error_code)
    if code == ErrorCode.TOPIC_ALREADY_EXISTS and if_not_exists:
        if as_json:
            print_json({"name": name, "result": "exists"})
        else:
            typer.echo(f"topic {name} already exists")
        return
    if code != ErrorCode.NONE:
        raise KraftError(code, result.error_message)
    if as_json:
        print_json(
            {
                "name": name,
                "result": "validated" if validate_only else "created",
                "topic_id": result.topic_id or None,
                "partitions": result.num_partitions,
                "replication_factor": result.replication_factor,
            }
        )
        return
    verb = "would be created" if validate_only else "created"
    typer.echo(
        f"topic {name} {verb}: id {result.topic_id}, {result.num_partitions} partitions, "
        f"replication factor {result.replication_factor}"
    )


async def _describe(
    bootstrap: str, names: list[str], partitions: bool, timeout_s: float
) -> cpb.DescribeTopicsResponse:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        return await client.call(
            lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest(names=names, include_partitions=partitions)
        )


@app.command("list")
@handle_errors
def list_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    as_json: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """Every topic with its partition count and replication factor.

    Examples:

      kraft topic list --bootstrap-controller 127.0.0.1:9093

      kraft topic list --bootstrap-controller 127.0.0.1:9093 --json
    """
    response = run_async(_describe(bootstrap_from(bootstrap_controller, cluster_dir), [], False, timeout))
    topics = [
        {
            "name": t.name,
            "topic_id": t.topic_id,
            "partitions": len(t.partitions),
            "replication_factor": len(t.partitions[0].replicas) if t.partitions else 0,
        }
        for t in response.topics
    ]
    if as_json:
        print_json(topics)
        return
    print_table(
        ["Name", "TopicId", "Partitions", "ReplicationFactor"],
        [[t["name"], t["topic_id"], t["partitions"], t["replication_factor"]] for t in topics],
    )


LEADER_RECOVERY_STATES = {0: "RECOVERED", 1: "RECOVERING"}  # KIP-704's LeaderRecoveryState


def topic_json(topic: cpb.TopicDescription) -> dict[str, Any]:
    """The ``topic describe --json`` object (ARCHITECTURE.md §7)."""
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        "configs": {c.name: c.value for c in topic.configs},
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                # KIP-966 (kafka-topics.sh --describe's Elr / LastKnownElr): eligible leaders while the
                # ISR is below min.insync.replicas, and those that stopped being eligible since
                "elr": list(p.eligible_leader_replicas),
                "last_known_elr": list(p.last_known_elr),
                "leader_recovery_state": LEADER_RECOVERY_STATES.get(p.leader_recovery_state, "UNKNOWN"),
            }
            for p in topic.partitions
        ],
    }


def only_under_replicated(described: dict[str, Any]) -> dict[str, Any]:
    """``described`` with only the partitions whose ISR is smaller than their replica set (Kafka's
    ``--under-replicated-partitions``)."""
    partitions = [p for p in described["partitions"] if len(p["isr"]) < len(p["replicas"])]
    return {**described, "partitions": partitions}


def only_unavailable(described: dict[str, Any], live_brokers: set[int]) -> dict[str, Any]:
    """``described`` with only the partitions that have no leader or whose leader is not a live
    (registered, unfenced) broker (Kafka's ``--unavailable-partitions``): nobody can produce to them."""
    partitions = [p for p in described["partitions"] if p["leader"] < 0 or p["leader"] not in live_brokers]
    return {**described, "partitions": partitions}


LIVE_BROKER_STATES = ("ACTIVE", "CONTROLLED_SHUTDOWN")  # registered and unfenced: able to lead


async def _describe_with_brokers(
    bootstrap: str, names: list[str], with_brokers: bool, timeout_s: float
) -> tuple[cpb.DescribeTopicsResponse, set[int]]:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        topics = await client.call(
            lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest(names=names, include_partitions=True)
        )
        if not with_brokers:
            return topics, set()
        cluster = await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
    return topics, {b.broker_id for b in cluster.brokers if b.state in LIVE_BROKER_STATES}


@app.command("describe")
@handle_errors
def describe_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    name: Annotated[
        str | None, typer.Argument(help="The topic name (every topic when left out).", show_default=False)
    ] = None,
    as_json: JsonOption = False,
    under_replicated: Annotated[
        bool,
        typer.Option(
            "--under-replicated-partitions", help="Only partitions whose ISR is smaller than their replicas."
        ),
    ] = False,
    command_config: CommandConfigOption = None,
    unavailable: Annotated[
        bool,
        typer.Option(
            "--unavailable-partitions",
            help="Only partitions without a leader or whose leader is not a live broker.",
        ),
    ] = False,
) -> None:
    """A topic's id, configs and every partition's leader, leader epoch, replicas, ISR, ELR and last known
    ELR (KIP-966: the replicas still eligible to lead while the ISR is below min.insync.replicas).

    Without a name every topic is described; with --under-replicated-partitions or
    --unavailable-partitions (kafka-topics.sh's flags, both may be given) only the matching partitions
    are shown, and without a name only the topics that have some (--json: a list of topics).

    Examples:

      kraft topic describe --bootstrap-controller 127.0.0.1:9093 orders

      kraft topic describe --bootstrap-controller 127.0.0.1:9093 orders --json

      kraft topic describe --bootstrap-controller 127.0.0.1:9093 --under-replicated-partitions

      kraft topic describe --bootstrap-controller 127.0.0.1:9093 --unavailable-partitions
    """
    names = [] if name is None else [name]
    response, live = run_async(
        _describe_with_brokers(bootstrap_from(bootstrap_controller, cluster_dir), names, unavailable, timeout)
    )
    described_all: list[dict[str, Any]] = []
    for topic in response.topics:
        if topic.error_code != ErrorCode.NONE:
            raise KraftError(ErrorCode.from_wire(topic.error_code), topic.error_message)
        described = topic_json(topic)
        if under_replicated:
            described = only_under_replicated(described)
        if unavailable:
            described = only_unavailable(described, live)
        filtered = under_replicated or unavailable
        if name is not None or not filtered or described["partitions"]:
            described_all.append(described)
    if name is not None:
        if as_json:
            print_json(described_all[0])
        else:
            _print_topic(described_all[0])
        return
    if as_json:
        print_json(described_all)
        return
    for i, described in enumerate(described_all):
        if i:
            typer.echo("")
        _print_topic(described)


def _print_topic(described: dict[str, Any]) -> None:
    print_key_values(
        [
            ("Topic", described["name"]),
            ("TopicId", described["topic_id"]),
            ("Configs", ",".join(f"{k}={v}" for k, v in described["configs"].items()) or None),
        ]
    )
    recovering = any(p["leader_recovery_state"] != "RECOVERED" for p in described["partitions"])
    headers = ["Partition", "Leader", "LeaderEpoch", "Replicas", "Isr", "Elr", "LastKnownElr"]
    rows = [
        [p["partition"], p["leader"], p["leader_epoch"], ",".join(map(str, p["replicas"])),
         ",".join(map(str, p["isr"])), ",".join(map(str, p["elr"])), ",".join(map(str, p["last_known_elr"]))]
        for p in described["partitions"]
    ]  # fmt: skip
    if recovering:  # only after an unclean election (KIP-704): the column stays out otherwise
        headers.append("LeaderRecoveryState")
        for row, p in zip(rows, described["partitions"], strict=True):
            row.append(p["leader_recovery_state"])
    print_table(headers, rows)


async def _grow(
    bootstrap: str, request: cpb.CreatePartitionsRequest, verbose: bool, timeout_s: float
) -> cpb.CreatePartitionsTopicResult:
    async with _client(bootstrap, verbose, timeout_s) as client:
        response = await client.create_partitions(request)
    return response.topics[0]


def alter_json(
    name: str, count: int, result: cpb.CreatePartitionsTopicResult, validate_only: bool
) -> dict[str, Any]:
    """The ``topic alter --json`` object: the new count and where the new partitions went."""
    return {
        "name": name,
        "result": "validated" if validate_only else "altered",
        "partitions": count,
        "new_partitions": [
            {"partition": a.partition, "replicas": list(a.broker_ids)} for a in result.assignments
        ],
    }


@app.command("alter")
@handle_errors
def alter_command(
    topic: Annotated[str, typer.Option("--topic", help="The topic to grow.", show_default=False)],
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions", "-p", help="The new total partition count (larger than now).", show_default=False
        ),
    ],
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    validate_only: Annotated[bool, typer.Option("--validate-only", help="Check only; add nothing.")] = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Add partitions to a topic (kafka-topics.sh --alter --partitions); partitions can only be added.

    The new partitions get the topic's replication factor and are placed like a new topic's (spread
    evenly and rack-aware over the unfenced brokers); their brokers create them as they apply the
    metadata.  Records with keys hash to other partitions afterwards, as in Kafka.

    Examples:

      kraft topic alter --bootstrap-controller 127.0.0.1:9093 --topic orders --partitions 12

      kraft topic alter --cluster-dir /tmp/c --topic orders --partitions 12 --validate-only --json
    """
    if partitions < 1:
        raise CliError(f"--partitions {partitions}: the new partition count must be positive")
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    request = cpb.CreatePartitionsRequest(
        topics=[cpb.CreatePartitionsTopic(name=topic, count=partitions)], validate_only=validate_only
    )
    result = run_async(_grow(bootstrap, request, verbose, timeout))
    code = ErrorCode.from_wire(result.error_code)
    if code != ErrorCode.NONE:
        raise KraftError(code, result.error_message)
    described = alter_json(topic, partitions, result, validate_only)
    if as_json:
        print_json(described)
        return
    verb = "would have" if validate_only else "now has"
    placed = "; ".join(
        f"{p['partition']} on {','.join(map(str, p['replicas']))}" for p in described["new_partitions"]
    )
    typer.echo(f"topic {topic} {verb} {partitions} partitions (new: {placed})")


async def _delete(bootstrap: str, name: str, verbose: bool, timeout_s: float) -> cpb.DeletableTopicResult:
    async with _client(bootstrap, verbose, timeout_s) as client:
        response = await client.delete_topics(cpb.DeleteTopicsRequest(names=[name]))
    return response.topics[0]


@app.command("delete")
@handle_errors
def delete_command(
    name: TopicArgument,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    if_exists: Annotated[bool, typer.Option("--if-exists", help="A missing topic is not an error.")] = False,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Delete a topic (its partitions are removed from every broker).

    Examples:

      kraft topic delete --bootstrap-controller 127.0.0.1:9093 orders

      kraft topic delete --bootstrap-controller 127.0.0.1:9093 old --if-exists --json
    """
    result = run_async(_delete(bootstrap_from(bootstrap_controller, cluster_dir), name, verbose, timeout))
    code = ErrorCode.from_wire(result.error_code)
    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and if_exists:
        if as_json:
            print_json({"name": name, "result": "not_found"})
        else:
            typer.echo(f"topic {name} does not exist")
        return
    if code != ErrorCode.NONE:
        raise KraftError(code, result.error_message)
    if as_json:
        print_json({"name": name, "result": "deleted"})
    else:
        typer.echo(f"topic {name} deleted")


class ElectionType(enum.StrEnum):
    """kafka-leader-election.sh's ``--election-type``."""

    PREFERRED = "preferred"
    UNCLEAN = "unclean"


# ElectLeadersRequest.election_type: Kafka's ElectionType numbers (controller.proto).
ELECTION_TYPE_VALUES = {ElectionType.PREFERRED: 0, ElectionType.UNCLEAN: 1}


def elect_request(
    topic: str | None, partition: int | None, election_type: ElectionType = ElectionType.PREFERRED
) -> cpb.ElectLeadersRequest:
    """The ElectLeaders request for ``--topic``/``--partition`` (neither = every partition)."""
    if partition is not None and topic is None:
        raise CliError("--partition needs --topic")
    if partition is not None and partition < 0:
        raise CliError(f"--partition {partition} is negative")
    request = cpb.ElectLeadersRequest(election_type=ELECTION_TYPE_VALUES[election_type])
    if topic is not None:
        request.topic_partitions.append(
            cpb.TopicPartitions(topic=topic, partitions=[] if partition is None else [partition])
        )
    return request


def election_rows(response: cpb.ElectLeadersResponse) -> list[dict[str, Any]]:
    """Every partition's outcome, flattened from the per-topic groups of the answer."""
    return [election_json(group.topic, result) for group in response.topics for result in group.partitions]


def election_json(topic: str, result: cpb.PartitionElectionResult) -> dict[str, Any]:
    """One partition's outcome: ``result`` is ``ELECTED`` or the Kafka error name."""
    code = ErrorCode.from_wire(result.error_code)
    return {
        "topic": topic,
        "partition": result.partition,
        "result": "ELECTED" if code is ErrorCode.NONE else code.name,
        "message": result.error_message or None,
    }


def election_failures(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outcomes that are errors (a preferred leader that already leads, or a partition that has a leader
    for an unclean election, is not one, as in Kafka's LeaderElectionCommand)."""
    return [r for r in results if r["result"] not in ("ELECTED", ErrorCode.ELECTION_NOT_NEEDED.name)]


async def _elect(
    bootstrap: str, request: cpb.ElectLeadersRequest, timeout_s: float
) -> cpb.ElectLeadersResponse:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        return await client.call(lambda s: s.ElectLeaders, request)


ELECT_EXAMPLES = """\
Examples:

  kraft topic elect-leaders --bootstrap-controller 127.0.0.1:9093

  kraft topic elect-leaders --bootstrap-controller 127.0.0.1:9093 --topic logs

  kraft topic elect-leaders --bootstrap-controller 127.0.0.1:9093 \\
      --topic orders --partition 3 --json

  kraft topic elect-leaders --bootstrap-controller 127.0.0.1:9093 \\
      --election-type unclean --topic orders --partition 0
"""


@app.command("elect-leaders", epilog=ELECT_EXAMPLES)
@handle_errors
def elect_leaders_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    topic: Annotated[
        str | None, typer.Option("--topic", help="Only this topic's partitions (default: every topic).")
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", help="Only this partition of --topic.")
    ] = None,
    election_type: Annotated[
        ElectionType,
        typer.Option(
            "--election-type",
            help="preferred: the first replica leads again; unclean: a leaderless partition elects a "
            "live replica, in sync or not (may lose acknowledged records).",
            case_sensitive=False,
        ),
    ] = ElectionType.PREFERRED,
    as_json: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """Leader election (kafka-leader-election.sh): preferred or unclean.

    preferred: each partition's first replica leads again if live and in sync.
    unclean: a partition without a leader elects a live replica — from the
    ISR or the eligible leaders if one is live, else the first live replica,
    which may lack acknowledged records (it starts RECOVERING, alone in its
    ISR) — whatever the topic's unclean.leader.election.enable says.
    Without --topic every partition is considered and only those whose
    election was needed are listed; with --topic/--partition each named
    partition gets a result.
    Exit status 1 when the request or any election failed
    (ELECTION_NOT_NEEDED is not a failure).
    """
    request = elect_request(topic, partition, election_type)
    response = run_async(_elect(bootstrap_from(bootstrap_controller, cluster_dir), request, timeout))
    if response.election_type != request.election_type:
        # A controller that predates election types ignores the field and runs a preferred election.
        raise CliError(
            f"the active controller ran a {'preferred' if response.election_type == 0 else 'different'} "
            f"election, not {election_type.value}: it predates --election-type (upgrade the controllers)"
        )
    results = election_rows(response)
    if as_json:
        print_json(results)
    elif results:
        print_table(
            ["Topic", "Partition", "Result", "Message"],
            [[r["topic"], r["partition"], r["result"], r["message"]] for r in results],
        )
    else:
        typer.echo(
            f"no partition needed {'an' if election_type is ElectionType.UNCLEAN else 'a'} "
            f"{election_type.value} leader election"
        )
    failures = election_failures(results)
    if failures:
        first = failures[0]
        raise CliError(
            f"{len(failures)} of {len(results)} elections failed; first: {first['topic']}-"
            f"{first['partition']} {first['result']}: {first['message'] or 'no details'}"
        )
