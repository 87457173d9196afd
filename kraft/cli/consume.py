"""``kraft consume``: read records of a topic partition from its leader (a data-path smoke test).

Starts at ``--offset`` (or the earliest offset with ``--from-beginning``, else the latest — Kafka's
console consumer default; when nothing arrives a one-line hint on stderr says so) and stops
after ``--max-records`` records or when no new record arrived for ``--idle-timeout`` seconds.  Prints
one value per line, or one JSON object per record with ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated

import typer

from kraft.cli.common import (
    MAX_WAIT_S,
    ClusterDirOption,
    CommandConfigOption,
    JsonOption,
    OptionalBootstrapServerOption,
    WaitSpinner,
    bootstrap_targets,
    broker_client,
    handle_errors,
    require_bootstrap,
    run_async,
)
from kraft.client.broker import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import broker_pb2 as pb

_POLL_WAIT_MS = 500


@handle_errors
def consume_command(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic name.", show_default=False)],
    bootstrap_server: OptionalBootstrapServerOption = None,
    cluster_dir: ClusterDirOption = None,
    partition: Annotated[int, typer.Option("--partition", "-p", min=0, help="Partition index.")] = 0,
    offset: Annotated[int | None, typer.Option("--offset", min=0, help="First offset to read.")] = None,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the earliest offset.")
    ] = False,
    max_records: Annotated[
        int, typer.Option("--max-records", min=1, help="Stop after this many.")
    ] = 1_000_000,
    idle_timeout_s: Annotated[
        float,
        typer.Option(
            "--idle-timeout", min=0.0, max=MAX_WAIT_S, help="Stop after this many seconds without records."
        ),
    ] = 2.0,
    cluster_id: Annotated[
        str,
        typer.Option("--cluster-id", help="The cluster id to send (empty: the one the first broker states)."),
    ] = "",
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0.1, max=MAX_WAIT_S, help="Seconds to keep retrying.")
    ] = 30.0,
    json_output: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """Read records of a topic partition from its leader; one value per line.

    Starts at the latest offset (new records only, as Kafka's console consumer) unless --offset or
    --from-beginning is given.  Stops after --max-records, or when no record came for --idle-timeout s.
    With --json each line is one record object (offset, key, value, …).
    A spinner on stderr shows the wait when stderr is a terminal.

    Examples:

      kraft consume --bootstrap-server localhost:9092 -t orders --from-beginning

      kraft consume --bootstrap-server h1:9092 -t orders -p 2 --offset 100

      kraft consume --bootstrap-server h1:9092 -t orders --from-beginning --json
    """
    if offset is not None and from_beginning:
        raise KraftError(ErrorCode.INVALID_REQUEST, "--offset and --from-beginning exclude each other")
    bootstrap = require_bootstrap(bootstrap_server, cluster_dir, brokers=True)
    targets = bootstrap_targets(bootstrap, "--bootstrap-server")
    start = offset if offset is not None else (EARLIEST_TIMESTAMP if from_beginning else LATEST_TIMESTAMP)
    with WaitSpinner(f"waiting for records of {topic}-{partition}…") as spinner:
        printed, first_position = run_async(
            _consume(
                targets,
                cluster_id,
                topic,
                partition,
                start,
                max_records,
                idle_timeout_s,
                timeout_s,
                json_output,
                spinner,
            )
        )
    if printed == 0 and start == LATEST_TIMESTAMP:
        # Like Kafka's console consumer, the default start is the latest offset: records produced before
        # the command are not shown.  Say so instead of exiting silently (stderr: stdout stays data).
        typer.echo(
            f"no new records in {topic}-{partition} after its latest offset {first_position} within "
            f"--idle-timeout {idle_timeout_s:g}s; use --from-beginning or --offset N to read older ones",
            err=True,
        )


async def _consume(
    targets: list[str],
    cluster_id: str,
    topic: str,
    partition: int,
    start: int,
    max_records: int,
    idle_timeout_s: float,
    timeout_s: float,
    json_output: bool,
    spinner: WaitSpinner,
) -> tuple[int, int]:
    """Print records; returns how many, and the offset reading started at."""
    loop = asyncio.get_running_loop()
    async with broker_client(targets, timeout_s, cluster_id=cluster_id) as client:
        position = (
            start if start >= 0 else await client.list_offset(topic, partition, start, deadline_s=timeout_s)
        )
        first_position = position
        printed = 0
        idle_until = loop.time() + idle_timeout_s
        while printed < max_records:
            wait_ms = max(0, min(_POLL_WAIT_MS, int((idle_until - loop.time()) * 1000)))
            response = await client.fetch(
                topic, partition, position, max_wait_ms=wait_ms, deadline_s=timeout_s
            )
            code = ErrorCode.from_wire(response.error_code)
            if code is not ErrorCode.NONE:
                raise KraftError(code, response.error_message)
            if response.records:
                with spinner.hidden():
                    for record in response.records[: max_records - printed]:
                        _print_record(topic, partition, record, json_output)
                        printed += 1
                spinner.update(f"read {printed} record(s) of {topic}-{partition}; waiting for more…")
                position = response.records[-1].offset + 1
                idle_until = loop.time() + idle_timeout_s
            elif loop.time() >= idle_until:
                break
        sys.stdout.flush()
    return printed, first_position


def _print_record(topic: str, partition: int, record: pb.BrokerRecord, json_output: bool) -> None:
    if json_output:
        line = json.dumps(
            {
                "topic": topic,
                "partition": partition,
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "leader_epoch": record.leader_epoch,
                "key": record.key.decode(errors="replace") if record.has_key else None,
                "value": record.value.decode(errors="replace") if record.has_value else None,
            }
        )
        sys.stdout.write(line + "\n")
    else:
        sys.stdout.write((record.value.decode(errors="replace") if record.has_value else "") + "\n")
