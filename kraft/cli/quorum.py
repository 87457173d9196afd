"""``kraft quorum describe`` — kafka-metadata-quorum.sh for kraft (answers come from the leader)."""

from __future__ import annotations

from typing import Annotated

import typer

from kraft.cli.common import (
    BootstrapControllerOption,
    CliError,
    CommandConfigOption,
    JsonOption,
    WaitSpinner,
    handle_errors,
    parse_bootstrap,
    print_json,
    print_key_values,
    print_table,
)
from kraft.client.quorum import describe_quorum, quorum_status, replication_rows

app = typer.Typer(no_args_is_help=True, help="Describe the controller quorum.")

_REPLICATION_COLUMNS = [
    "NodeId",
    "DirectoryId",
    "LogEndOffset",
    "Lag",
    "LastFetchTimestamp",
    "LastCaughtUpTimestamp",
    "Status",
]


@app.command("describe")
@handle_errors
def describe_command(
    bootstrap_controller: BootstrapControllerOption,
    status: Annotated[bool, typer.Option("--status", help="Leader, epoch, high watermark, lag.")] = False,
    replication: Annotated[
        bool, typer.Option("--replication", help="One row per voter and observer.")
    ] = False,
    as_json: JsonOption = False,
    timeout_ms: Annotated[
        int, typer.Option("--timeout-ms", min=100, help="Give up finding the leader after this long.")
    ] = 10_000,
    command_config: CommandConfigOption = None,
) -> None:
    """Describe the quorum as its leader sees it (kafka-metadata-quorum.sh).

    Any controller works: a non-leader's answer redirects to the leader.
    Waits up to --timeout-ms for a leader, with a spinner on a terminal.

    Examples:

      kraft quorum describe --bootstrap-controller localhost:9093 --status

      kraft quorum describe --bootstrap-controller h1:9093,h2:9093 --replication

      kraft quorum describe --bootstrap-controller h1:9093 --status --json
    """
    if status == replication:
        raise CliError("give exactly one of --status or --replication")
    targets = [endpoint.target for endpoint in parse_bootstrap(bootstrap_controller)]
    with WaitSpinner(f"asking {', '.join(targets)} for the quorum leader…"):
        response = describe_quorum(targets, timeout_s=timeout_ms / 1000.0)
    if status:
        view = quorum_status(response)
        if as_json:
            print_json(view.as_json())
            return
        print_key_values(
            [
                ("ClusterId", view.cluster_id),
                ("LeaderId", view.leader_id),
                ("LeaderEpoch", view.leader_epoch),
                ("HighWatermark", view.high_watermark),
                ("MaxFollowerLag", view.max_follower_lag),
                ("MaxFollowerLagTimeMs", view.max_follower_lag_time_ms),
                ("CurrentVoters", "[" + ",".join(str(v) for v in view.current_voters) + "]"),
                ("CurrentObservers", "[" + ",".join(str(o) for o in view.current_observers) + "]"),
            ]
        )
        return
    rows = replication_rows(response)
    if as_json:
        print_json([row.as_json() for row in rows])
        return
    print_table(
        _REPLICATION_COLUMNS,
        [
            [
                row.node_id,
                row.directory_id or None,
                row.log_end_offset,
                row.lag,
                row.last_fetch_timestamp,
                row.last_caught_up_timestamp,
                row.status,
            ]
            for row in rows
        ],
    )
