"""``kraft quorum describe|add-controller|remove-controller`` — kafka-metadata-quorum.sh for kraft
(answers come from the leader)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from kraft.cli.common import (
    MAX_WAIT_MS,
    MAX_WAIT_S,
    CliError,
    ClusterDirOption,
    CommandConfigOption,
    JsonOption,
    OptionalBootstrapControllerOption,
    VerboseOption,
    WaitSpinner,
    bootstrap_from,
    bootstrap_targets,
    handle_errors,
    print_json,
    print_key_values,
    print_table,
    request_timeout_s,
    require_bootstrap,
    retry_backoff_s,
    timeout_seconds,
    verbose_printer,
)
from kraft.client.quorum import (
    Pacing,
    controller_targets,
    describe_quorum,
    gather_peer_problems,
    quorum_status,
    remove_controller,
    replication_rows,
)
from kraft.client.rotation import UNREACHABLE_TIMEOUT_S
from kraft.cluster.membership import add_joining_controller, joining_controller
from kraft.errors import KraftError
from kraft.storage.ids import parse_uuid

app = typer.Typer(no_args_is_help=True, help="Describe the controller quorum; add and remove controllers.")

_DESCRIBE_TIMEOUT_S = 10.0
_CHANGE_TIMEOUT_S = 30.0

_TimeoutSecondsOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        min=0.1,
        max=MAX_WAIT_S,
        help="Seconds to wait (as the other commands' --timeout).",
        show_default=False,
    ),
]


def _pacing() -> Pacing:
    """This command's DescribeQuorum attempts: one RPC at most ``request.timeout.ms`` and ``retry.backoff.ms``
    between rounds (the client properties', as every other command's), never a fixed 2 s."""
    return Pacing(request_timeout_s=request_timeout_s(), retry_backoff_s=retry_backoff_s())


_PROBE_TIMEOUT_S = 2.0
"""Per controller, when each is asked for its peer problems (all at once; a best-effort look, so at most
this even when ``request.timeout.ms`` is longer, and never more than a shorter ``request.timeout.ms``)."""


def _probe_timeout_s() -> float:
    return min(_PROBE_TIMEOUT_S, request_timeout_s())


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
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    status: Annotated[bool, typer.Option("--status", help="Leader, epoch, high watermark, lag.")] = False,
    replication: Annotated[
        bool, typer.Option("--replication", help="One row per voter and observer.")
    ] = False,
    as_json: JsonOption = False,
    timeout: _TimeoutSecondsOption = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--timeout-ms",
            min=100,
            max=MAX_WAIT_MS,
            help="Give up finding the leader after this long (default 10000; --timeout in ms).",
            show_default=False,
        ),
    ] = None,
    command_config: CommandConfigOption = None,
) -> None:
    """Describe the quorum as its leader sees it (kafka-metadata-quorum.sh).

    Any controller works: a non-leader's answer redirects to the leader.
    Waits up to --timeout seconds (or --timeout-ms) for a leader, with a spinner on a terminal.

    Examples:

      kraft quorum describe --bootstrap-controller localhost:9093 --status

      kraft quorum describe --bootstrap-controller h1:9093,h2:9093 --replication

      kraft quorum describe --bootstrap-controller h1:9093 --status --json
    """
    if status == replication:
        raise CliError("give exactly one of --status or --replication")
    timeout_s = timeout_seconds(timeout, timeout_ms, _DESCRIBE_TIMEOUT_S)
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    targets = bootstrap_targets(bootstrap)
    try:
        with WaitSpinner(f"asking {', '.join(targets)} for the quorum leader…"):
            response = describe_quorum(
                targets,
                timeout_s=timeout_s,
                unreachable_timeout_s=UNREACHABLE_TIMEOUT_S,
                pacing=_pacing(),
            )
    except KraftError as exc:
        # No leader: what the controllers say about their peers is usually why (wrong voter ports, a
        # data dir of another cluster).
        found = gather_peer_problems(targets, _probe_timeout_s())
        if not found.problems:
            raise
        listed = "; ".join(str(p) for p in found.problems)
        raise CliError(f"{exc.code.name}: {exc.message}; peer problems: {listed}") from None
    if status:
        view = quorum_status(response)
        # Every controller is asked for its own peer problems: a misconfigured one is not the leader.
        problems = gather_peer_problems([*targets, *controller_targets(response)], _probe_timeout_s())
        if as_json:
            print_json({**view.as_json(), **problems.as_json()})
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
                ("Voters", ", ".join(_describe_replica(v) for v in view.voters) or "-"),
                ("Observers", ", ".join(_describe_replica(o) for o in view.observers) or "-"),
                ("PeerProblems", "; ".join(str(p) for p in problems.problems) or "-"),
                ("UnansweredControllers", ",".join(problems.unanswered) or "-"),
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


def _describe_replica(replica: dict[str, object]) -> str:
    """``id@directoryId NAME://host:port`` (``-`` for an unknown directory id)."""
    endpoints = replica.get("endpoints") or []
    assert isinstance(endpoints, list)
    text = f"{replica['id']}@{replica['directory_id'] or '-'}"
    return " ".join([text, *(str(e) for e in endpoints)])


_TimeoutMsOption = Annotated[
    int | None,
    typer.Option(
        "--timeout-ms",
        min=100,
        max=MAX_WAIT_MS,
        help="Give up if the change has not committed by then (default 30000; --timeout in ms).",
        show_default=False,
    ),
]


def _retry_printer(verbose: bool, spinner: WaitSpinner) -> Callable[[str], None] | None:
    """``--verbose``'s ``retry: …`` lines on stderr, drawn around the spinner."""
    show = verbose_printer(verbose)
    if show is None:
        return None

    def print_retry(line: str) -> None:
        with spinner.hidden():
            show(line)

    return print_retry


def _change_json(
    change: str, node_id: int, directory_id: str, offset: int | None, **extra: object
) -> dict[str, object]:
    """``--json`` of add-/remove-controller: ``voters_record_offset`` null when a retry found the change
    already in force (an attempt whose answer was lost had committed it)."""
    return {
        "change": change,
        "controller_id": node_id,
        "directory_id": directory_id,
        **extra,
        "voters_record_offset": offset,
        "in_force_after_unknown_outcome": offset is None,
    }


def _record_at(offset: int | None) -> str:
    if offset is None:  # a retry found the change in force: the leader that took it lost leadership
        return "in force: an attempt whose answer was lost had committed it"
    return f"VotersRecord at offset {offset}"


@app.command("add-controller")
@handle_errors
def add_controller_command(
    command_config: Annotated[
        Path,
        typer.Option(
            "--command-config",
            help="The joining controller's .properties (node.id, its CONTROLLER listener, metadata.log.dir).",
            show_default=False,
        ),
    ],
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: _TimeoutSecondsOption = None,
    timeout_ms: _TimeoutMsOption = None,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Add a running controller to the voters (KIP-853, kafka-metadata-quorum.sh add-controller).

    The joining controller must be formatted (its meta.properties holds its directory id) and running:
    it fetches as an observer, and the leader adds it once it has caught up.  One change at a time.

    Example:

      kraft quorum add-controller --bootstrap-controller h1:9093 --command-config controller-2.properties

      kraft quorum add-controller --cluster-dir /tmp/c --command-config c-2.properties --timeout 60

      kraft quorum add-controller --cluster-dir /tmp/c --command-config c-2.properties --json --verbose
    """
    timeout_s = timeout_seconds(timeout, timeout_ms, _CHANGE_TIMEOUT_S)
    targets = bootstrap_targets(require_bootstrap(bootstrap_controller, cluster_dir))
    joiner = joining_controller(command_config)
    with WaitSpinner(f"adding controller {joiner.node_id} (waits for it to catch up)…") as spinner:
        offset = add_joining_controller(
            targets,
            joiner,
            timeout_s,
            on_retry=_retry_printer(verbose, spinner),
            unreachable_timeout_s=UNREACHABLE_TIMEOUT_S,
            pacing=_pacing(),
        )
    if as_json:
        e = joiner.endpoint
        endpoint = f"{e.name}://{e.host}:{e.port}"
        print_json(_change_json("added", joiner.node_id, joiner.directory_id, offset, endpoint=endpoint))
        return
    typer.echo(f"Added {joiner.describe()} ({_record_at(offset)})")


@app.command("remove-controller")
@handle_errors
def remove_controller_command(
    controller_id: Annotated[int, typer.Option("--controller-id", min=0, help="The voter's node id.")],
    controller_directory_id: Annotated[
        str,
        typer.Option(
            "--controller-directory-id",
            help="The voter's directory id (quorum describe --replication shows it).",
            show_default=False,
        ),
    ],
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: _TimeoutSecondsOption = None,
    timeout_ms: _TimeoutMsOption = None,
    command_config: CommandConfigOption = None,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Remove a voter (KIP-853, kafka-metadata-quorum.sh remove-controller); a leader removing itself
    hands over once the change commits.

    Example:

      kraft quorum remove-controller --bootstrap-controller h1:9093 --controller-id 3 \\
        --controller-directory-id 8xCd4lEkRcOvtdUSbkVc2g

      kraft quorum remove-controller --cluster-dir /tmp/c --controller-id 3 \\
        --controller-directory-id 8xCd4lEkRcOvtdUSbkVc2g --timeout 60

    On a TLS quorum ``--command-config`` must name a controller's certificate (ssl.keystore.*): voter
    changes, like every Raft RPC that moves the quorum, are taken only from controllers.
    """
    try:
        parse_uuid(controller_directory_id)
    except ValueError as exc:
        raise CliError(f"--controller-directory-id: {exc}") from None
    timeout_s = timeout_seconds(timeout, timeout_ms, _CHANGE_TIMEOUT_S)
    targets = bootstrap_targets(require_bootstrap(bootstrap_controller, cluster_dir))
    with WaitSpinner(f"removing controller {controller_id}…") as spinner:
        offset = remove_controller(
            targets,
            controller_id,
            controller_directory_id,
            timeout_s,
            on_retry=_retry_printer(verbose, spinner),
            unreachable_timeout_s=UNREACHABLE_TIMEOUT_S,
            pacing=_pacing(),
        )
    if as_json:
        print_json(_change_json("removed", controller_id, controller_directory_id, offset))
        return
    typer.echo(
        f"Removed controller {controller_id} with directory id {controller_directory_id} "
        f"({_record_at(offset)})"
    )
