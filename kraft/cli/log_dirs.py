"""``kraft log-dirs describe`` (kafka-log-dirs.sh --describe): every broker's log dirs, the bytes each
hosted partition takes, the file system's free space, and the dirs taken offline after an I/O error."""

from __future__ import annotations

from typing import Annotated, Any

import grpc
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
    print_table,
    run_async,
)
from kraft.errors import ErrorCode
from kraft.v1 import broker_pb2 as pb

app = typer.Typer(
    no_args_is_help=True, help="Brokers' log dirs: partition sizes, offline dirs (kafka-log-dirs.sh)."
)


def log_dir_json(log_dir: pb.DescribeLogDirsResponse.LogDir) -> dict[str, Any]:
    code = ErrorCode.from_wire(log_dir.error_code)
    return {
        "path": log_dir.path,
        "error": None if code is ErrorCode.NONE else f"{code.name}: {log_dir.error_message}",
        "total_bytes": log_dir.total_bytes if log_dir.total_bytes >= 0 else None,
        "usable_bytes": log_dir.usable_bytes if log_dir.usable_bytes >= 0 else None,
        "partitions": [
            {"topic": p.topic, "partition": p.partition, "size": p.size_bytes, "offset_lag": p.offset_lag}
            for p in log_dir.partitions
        ],
    }


async def _describe(
    bootstrap: str, brokers: list[int] | None, topics: list[str], timeout_s: float
) -> list[dict[str, Any]]:
    targets = bootstrap_targets(bootstrap, "--bootstrap-server")
    async with broker_client(targets, timeout_s) as client:
        metadata = await client.metadata([])
        known = {
            b.broker_id: f"{b.endpoints[0].host or '127.0.0.1'}:{b.endpoints[0].port}"
            for b in metadata.brokers
            if b.endpoints
        }
        chosen = sorted(known) if brokers is None else brokers
        unknown = [b for b in chosen if b not in known]
        if unknown:
            raise CliError(f"broker {unknown[0]} is not registered (registered: {sorted(known)})")
        results = []
        for broker_id in chosen:
            entry: dict[str, Any] = {
                "broker": broker_id,
                "endpoint": known[broker_id],
                "error": None,
                "log_dirs": [],
            }
            request = pb.DescribeLogDirsRequest(cluster_id=metadata.cluster_id, topics=topics)
            try:
                answer = await client.stub(known[broker_id]).DescribeLogDirs(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as err:
                entry["error"] = f"{err.code().name}: {err.details()}"
            else:
                code = ErrorCode.from_wire(answer.error_code)
                if code is not ErrorCode.NONE:
                    entry["error"] = f"{code.name}: {answer.error_message}"
                entry["log_dirs"] = [log_dir_json(d) for d in answer.log_dirs]
            results.append(entry)
        return results


def _rows(results: list[dict[str, Any]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for entry in results:
        for log_dir in entry["log_dirs"]:
            if log_dir["error"]:
                rows.append([entry["broker"], log_dir["path"], None, None, None, log_dir["error"]])
                continue
            for p in log_dir["partitions"]:
                lag = p["offset_lag"] if p["offset_lag"] >= 0 else None
                rows.append(
                    [entry["broker"], log_dir["path"], f"{p['topic']}-{p['partition']}", p["size"], lag, None]
                )
            if not log_dir["partitions"]:
                rows.append([entry["broker"], log_dir["path"], None, None, None, None])
    return rows


@app.command("describe")
@handle_errors
def describe_command(
    broker: Annotated[
        list[int] | None,
        typer.Option(
            "--broker", help="Only this broker id (repeatable; default: every broker).", show_default=False
        ),
    ] = None,
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Only this topic's partitions (repeatable).", show_default=False),
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
    """Each broker's log dirs with every hosted partition's size on disk and a follower's offset lag;
    offline log dirs with the error that took them offline (kafka-log-dirs.sh --describe).

    Exit status 1 when a broker could not be asked (the others are still printed).

    Examples:

      kraft log-dirs describe --bootstrap-server 127.0.0.1:9092

      kraft log-dirs describe --cluster-dir /tmp/c --broker 101 --topic orders --json
    """
    bootstrap = bootstrap_from(bootstrap_server, cluster_dir, brokers=True)
    results = run_async(_describe(bootstrap, list(broker) if broker else None, list(topic or []), timeout))
    if as_json:
        print_json(results)
    else:
        print_table(["Broker", "LogDir", "Partition", "Size", "OffsetLag", "Error"], _rows(results))
        for entry in results:
            for log_dir in entry["log_dirs"]:
                if log_dir["usable_bytes"] is not None:
                    typer.echo(
                        f"broker {entry['broker']} {log_dir['path']}: {log_dir['usable_bytes']} of "
                        f"{log_dir['total_bytes']} bytes usable"
                    )
    failed = [e for e in results if e["error"]]
    if failed:
        raise CliError(f"broker {failed[0]['broker']} ({failed[0]['endpoint']}): {failed[0]['error']}")
