"""``kraft produce``: append records to a topic partition through its leader (a data-path smoke test).

Values come from ``--value`` options, or from stdin one per line when none is given.  Records go out in
batches of ``--batch-size``; NOT_LEADER_OR_FOLLOWER and other retriable answers refresh the metadata and
retry on the new leader until ``--timeout``.  A topic or partition the brokers do not know yet (created a
moment ago) is waited for up to the client properties' ``max.block.ms`` (Kafka's producer key, default
60000) capped by ``--timeout``, metadata asked again every ``retry.backoff.ms``; then it is
UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
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
    max_block_s,
    print_json,
    require_bootstrap,
    run_async,
)
from kraft.errors import ErrorCode, KraftError


class AcksOption(enum.StrEnum):
    ALL = "all"
    LEADER = "1"
    NONE = "0"


ACKS_VALUES = {AcksOption.ALL: -1, AcksOption.LEADER: 1, AcksOption.NONE: 0}


@handle_errors
def produce_command(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic name.", show_default=False)],
    bootstrap_server: OptionalBootstrapServerOption = None,
    cluster_dir: ClusterDirOption = None,
    partition: Annotated[int, typer.Option("--partition", "-p", min=0, help="Partition index.")] = 0,
    value: Annotated[
        list[str] | None,
        typer.Option("--value", "-v", help="A record value (repeatable); default: stdin lines."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", "-k", help="Key of every record (default: none).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Records per Produce request.")
    ] = 100,
    cluster_id: Annotated[
        str,
        typer.Option("--cluster-id", help="The cluster id to send (empty: the one the first broker states)."),
    ] = "",
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0.1, max=MAX_WAIT_S, help="Seconds to keep retrying.")
    ] = 30.0,
    acks: Annotated[
        AcksOption,
        typer.Option(
            "--acks",
            help="all: answered once every in-sync replica has the records on disk; 1: once the leader "
            "appended them; 0: as 1 (gRPC always answers).",
        ),
    ] = AcksOption.ALL,
    json_output: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """Append records to a topic partition through its leader; prints their offsets.

    Values come from --value, else one per line from stdin.
    After a leader change it retries on the new leader until --timeout.
    A topic not known yet is waited for up to max.block.ms (--command-config; 60000), at most --timeout.
    A spinner on stderr shows progress when stderr is a terminal.

    Examples:

      kraft produce --bootstrap-server localhost:9092 -t orders -v a -v b

      seq 1000 | kraft produce --bootstrap-server h1:9092,h2:9092 -t orders

      kraft produce --bootstrap-server localhost:9092 -t orders -k k1 -v x --json
    """
    acks_value = ACKS_VALUES[acks]
    # The bootstrap list first: without one, reading stdin would wait for input that goes nowhere.
    bootstrap = require_bootstrap(bootstrap_server, cluster_dir, brokers=True)
    targets = bootstrap_targets(bootstrap, "--bootstrap-server")
    values = list(value) if value else [line.rstrip("\n") for line in sys.stdin]
    if not values:
        raise KraftError(ErrorCode.INVALID_REQUEST, "nothing to produce: give --value or lines on stdin")
    key_bytes = None if key is None else key.encode()
    payload = [(key_bytes, v.encode()) for v in values]
    where = f"{topic}-{partition}"
    with WaitSpinner(f"producing {len(payload)} record(s) to {where}…") as spinner:

        def report(done: int) -> None:
            spinner.update(f"producing to {where}: {done}/{len(payload)} record(s) acknowledged…")

        first, last = run_async(
            _produce(
                targets, cluster_id, topic, partition, payload, batch_size, timeout_s, report, acks_value
            )
        )
    if json_output:
        print_json(
            {
                "topic": topic,
                "partition": partition,
                "count": len(values),
                "base_offset": first,
                "last_offset": last,
            }
        )
    else:
        typer.echo(f"produced {len(values)} record(s) to {topic}-{partition} at offsets {first}..{last}")


async def _produce(
    targets: list[str],
    cluster_id: str,
    topic: str,
    partition: int,
    payload: list[tuple[bytes | None, bytes]],
    batch_size: int,
    timeout_s: float,
    on_progress: Callable[[int], None],
    acks: int = -1,
) -> tuple[int, int]:
    first = -1
    last = -1
    block_s = max_block_s(timeout_s)
    async with broker_client(targets, timeout_s, cluster_id=cluster_id) as client:
        for start in range(0, len(payload), batch_size):
            batch = payload[start : start + batch_size]
            response = await client.produce(
                topic, partition, batch, deadline_s=timeout_s, acks=acks, max_block_s=block_s
            )
            code = ErrorCode.from_wire(response.error_code)
            if code is not ErrorCode.NONE:
                raise KraftError(code, response.error_message)
            if first < 0:
                first = response.base_offset
            last = response.base_offset + len(batch) - 1
            on_progress(start + len(batch))
    return first, last
