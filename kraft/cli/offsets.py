"""``kraft offsets get`` (kafka-get-offsets.sh): a topic's earliest or latest offsets, from each partition's
leader (ListOffsets; latest = the high watermark, what a consumer can read up to)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kraft.cli.common import (
    DEFAULT_TIMEOUT_S,
    CliError,
    ClusterDirOption,
    CommandConfigOption,
    JsonOption,
    TimeoutOption,
    bootstrap_from,
    bootstrap_targets,
    broker_client,
    handle_errors,
    print_json,
    run_async,
)
from kraft.errors import ErrorCode, KraftError

app = typer.Typer(no_args_is_help=True, help="Partition offsets (kafka-get-offsets.sh).")

EARLIEST = -2
LATEST = -1
_TIMES = {"earliest": EARLIEST, "-2": EARLIEST, "latest": LATEST, "-1": LATEST}


def parse_time(text: str) -> int:
    """``earliest``/``-2`` or ``latest``/``-1`` (Kafka's sentinels); a timestamp is refused, saying why."""
    value = _TIMES.get(text.strip().lower())
    if value is not None:
        return value
    if text.strip().isdigit():
        raise CliError(
            f"--time {text}: looking offsets up by timestamp is not supported (kraft brokers keep no time "
            "index); use earliest or latest"
        )
    raise CliError(f"--time {text!r} is not earliest, latest, -2 or -1")


def parse_partitions(text: str | None) -> list[int] | None:
    """``0,2,5`` → [0, 2, 5] (None: every partition)."""
    if text is None:
        return None
    result: list[int] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item.isdigit():
            raise CliError(f"--partitions {text!r}: {item!r} is not a partition number")
        if int(item) not in result:
            result.append(int(item))
    if not result:
        raise CliError("--partitions is empty")
    return result


async def _offsets(
    bootstrap: str, topic: str, partitions: list[int] | None, timestamp: int, timeout_s: float
) -> list[dict[str, Any]]:
    targets = bootstrap_targets(bootstrap, "--bootstrap-server")
    async with broker_client(targets, timeout_s) as client:
        metadata = await client.metadata([topic])
        found = next((t for t in metadata.topics if t.name == topic), None)
        if found is None or found.error_code != ErrorCode.NONE:
            message = found.error_message if found is not None else ""
            raise KraftError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, message or f"topic {topic!r} does not exist"
            )
        count = len(found.partitions)
        wanted = partitions if partitions is not None else list(range(count))
        missing = [p for p in wanted if p >= count]
        if missing:
            raise CliError(
                f"topic {topic} has {count} partition(s), 0..{count - 1}; no partition {missing[0]}"
            )
        rows = []
        for partition in wanted:
            offset = await client.list_offset(topic, partition, timestamp, deadline_s=timeout_s)
            rows.append({"topic": topic, "partition": partition, "offset": offset})
        return rows


@app.command("get")
@handle_errors
def get_command(
    topic: Annotated[str, typer.Option("--topic", help="The topic.", show_default=False)],
    time: Annotated[
        str, typer.Option("--time", help="earliest (-2) or latest (-1: the high watermark).")
    ] = "latest",
    partitions: Annotated[
        str | None,
        typer.Option(
            "--partitions", help="Comma-separated partitions (default: every one).", show_default=False
        ),
    ] = None,
    bootstrap_server: Annotated[
        str | None,
        typer.Option(
            "--bootstrap-server",
            help="Broker endpoint(s): host:port[,…] (default: the brokers of --cluster-dir).",
            show_default=False,
        ),
    ] = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each partition's earliest or latest offset, asked of its leader (kafka-get-offsets.sh).

    Prints topic:partition:offset lines, as Kafka's tool does.

    Examples:

      kraft offsets get --bootstrap-server 127.0.0.1:9092 --topic orders

      kraft offsets get --cluster-dir /tmp/c --topic orders --time earliest --partitions 0,1 --json
    """
    timestamp = parse_time(time)
    wanted = parse_partitions(partitions)
    bootstrap = bootstrap_from(bootstrap_server, cluster_dir, brokers=True)
    rows = run_async(_offsets(bootstrap, topic, wanted, timestamp, timeout))
    if as_json:
        print_json(rows)
        return
    for row in rows:
        typer.echo(f"{row['topic']}:{row['partition']}:{row['offset']}")
