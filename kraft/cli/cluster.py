"""``kraft cluster up|status|down|restart|stop|start``: a whole local cluster in one directory."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kraft.cli.common import (
    MAX_WAIT_S,
    CliError,
    JsonOption,
    WaitSpinner,
    handle_errors,
    print_json,
    print_table,
)
from kraft.client.channel import set_default_security
from kraft.cluster.manager import ClusterError, ClusterStatus, LocalCluster
from kraft.cluster.process import ProcessError
from kraft.cluster.profiles import PROFILES
from kraft.cluster.rolling import Restarted, RollingRestart
from kraft.cluster.spec import NodeRole

app = typer.Typer(no_args_is_help=True, help="Run a local cluster: controllers and brokers as processes.")

DirOption = Annotated[
    Path,
    typer.Option(
        "--dir", "-d", envvar="KRAFT_CLUSTER_DIR", help="The cluster directory (configs, data, logs, pids)."
    ),
]
TimeoutOption = Annotated[float, typer.Option("--timeout", min=1.0, max=MAX_WAIT_S, help="Seconds to wait.")]
_DEFAULT_DIR = Path("kraft-cluster")
_COLUMNS = ["id", "role", "pid", "endpoint", "state", "log"]


def _status_rows(status: ClusterStatus) -> list[list[object]]:
    return [[n.node_id, n.role, n.pid, n.endpoint, n.state, n.log] for n in status.nodes]


def _print_status(status: ClusterStatus, as_json: bool) -> None:
    if as_json:
        print_json(status.as_json())
        return
    print_table(_COLUMNS, _status_rows(status), title=f"cluster {status.cluster_id} in {status.dir}")
    for node in status.nodes:
        if node.state in ("failed", "exited"):
            # Why a node is gone, without opening its log: its last fatal line (docs/troubleshooting.md).
            code = "unknown" if node.exit_code is None else str(node.exit_code)
            typer.echo(
                f"{node.name} {node.state} (exit {code}): {node.last_error or 'no fatal line in its log'}"
            )
    for node in status.nodes:
        for problem in node.peer_problems:
            typer.echo(f"{node.name} peer problem: {problem}")
    client = Path(status.dir) / "client.properties"
    tls = f" --command-config {client}" if client.exists() else ""
    for node in status.nodes:
        if node.state == "observer":  # a dynamic quorum's controller that is not (or no longer) a voter
            config = Path(status.dir) / "config" / f"{node.name}.properties"
            typer.echo(
                f"{node.name} is not a voter; to add it: kraft quorum add-controller "
                f"--bootstrap-controller {status.bootstrap(NodeRole.CONTROLLER)} --command-config {config}"
            )
    typer.echo(f"--bootstrap-controller {status.bootstrap(NodeRole.CONTROLLER)}{tls}")
    if status.bootstrap(NodeRole.BROKER):
        typer.echo(f"--bootstrap-server {status.bootstrap(NodeRole.BROKER)}{tls}")


def _open(directory: Path) -> LocalCluster:
    """The cluster in ``directory``; this process's channels then use its TLS client config, if any."""
    return _use_security(LocalCluster.open(directory))


def _use_security(cluster: LocalCluster) -> LocalCluster:
    set_default_security(cluster.client_security())
    return cluster


def _wait_with_progress(
    wait: Callable[[Callable[[ClusterStatus], None]], ClusterStatus], what: str
) -> ClusterStatus:
    """Run a wait loop under a spinner on stderr (stdout stays clean for tables and JSON)."""
    console = Console(stderr=True)
    with console.status(f"waiting for {what}…") as spinner:
        return wait(lambda s: spinner.update(f"waiting for {what}: {s.summary()}"))


def _node_ready_wait(
    cluster: LocalCluster, name: str, timeout_s: float
) -> Callable[[Callable[[ClusterStatus], None]], ClusterStatus]:
    return lambda report: cluster.wait_node_ready(name, timeout_s, on_status=report)


def _cluster_error(exc: ClusterError) -> CliError:
    return CliError(str(exc))


@app.command("up")
@handle_errors
def up_command(
    directory: DirOption = _DEFAULT_DIR,
    controllers: Annotated[
        int | None,
        typer.Option(
            "--controllers",
            min=1,
            help="Controllers (default 3 for a new directory; an existing one keeps its own).",
            show_default=False,
        ),
    ] = None,
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers",
            min=0,
            help="Brokers (default 3 for a new directory; an existing one keeps its own).",
            show_default=False,
        ),
    ] = None,
    base_port: Annotated[
        int | None,
        typer.Option(
            "--base-port", min=1, max=65000, help="First port (default: free ports).", show_default=False
        ),
    ] = None,
    profile: Annotated[
        str, typer.Option("--profile", help=f"Timing profile: {' | '.join(PROFILES)}.")
    ] = "default",
    metrics: Annotated[bool, typer.Option("--metrics", help="Give every node a Prometheus port.")] = False,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Mutual TLS on every listener: a local CA in DIR/tls, DIR/client.properties for the CLI.",
        ),
    ] = False,
    no_authorizer: Annotated[
        bool,
        typer.Option(
            "--no-authorizer",
            help="With --tls: no authorizer (any certificate of the CA may do anything). By default a TLS "
            "cluster denies everyone but its nodes and the admin certificate unless an ACL allows.",
        ),
    ] = False,
    dynamic: Annotated[
        bool,
        typer.Option(
            "--dynamic",
            help="A dynamic quorum (KIP-853): controller 1 formatted --standalone, the others "
            "--no-initial-controllers, started and added one at a time (kraft quorum add-controller).",
        ),
    ] = False,
    timeout_s: TimeoutOption = 60.0,
    keep_on_failure: Annotated[
        bool,
        typer.Option("--keep-on-failure", help="Leave the processes running if the cluster is not healthy."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Create (or restart) a cluster: write configs, format storage, start every node, wait until healthy.

    A new directory gets configs, formatted storage and cluster.json;
    an existing, stopped one is started again as it was.  A cluster that
    is not healthy within --timeout is stopped again (unless
    --keep-on-failure) and the failing node's last log line is shown.

    Examples:

      kraft cluster up            # 3 controllers, 3 brokers in ./kraft-cluster

      kraft cluster up --dir /tmp/c --brokers 1 --profile fast --json

      kraft cluster up --dir /tmp/c --base-port 19090

      kraft cluster up --dir /tmp/c --tls   # the CLI then takes --command-config /tmp/c/client.properties

      kraft cluster up --dir /tmp/c --tls --no-authorizer   # mTLS without ACLs

      kraft cluster up --dir /tmp/c --controllers 3 --dynamic   # grow a quorum 1 -> 3 with add-controller
    """
    if profile not in PROFILES:
        raise CliError(f"--profile {profile!r}: expected one of {', '.join(PROFILES)}")
    if no_authorizer and not tls:
        raise CliError("--no-authorizer goes with --tls (a PLAINTEXT cluster has no authorizer)")
    try:
        cluster, created = _create_or_reopen(
            directory,
            controllers,
            brokers,
            base_port,
            profile,
            metrics,
            tls,
            authorizer=not no_authorizer,
            dynamic=dynamic,
        )
        try:
            status = _start_in_order(cluster, timeout_s, grow=created and cluster.spec.dynamic)
        except (ClusterError, KeyboardInterrupt) as exc:
            # Leave nothing half-started behind unless asked to (e.g. to read a stuck node's state).
            if not keep_on_failure:
                cluster.down(timeout_s=5.0)
            if isinstance(exc, KeyboardInterrupt):
                raise CliError(f"interrupted; {'left' if keep_on_failure else 'stopped'} the nodes") from None
            raise
    except ClusterError as exc:
        raise _cluster_error(exc) from None
    _print_status(status, as_json)


def _start_in_order(cluster: LocalCluster, timeout_s: float, *, grow: bool = False) -> ClusterStatus:
    """Controllers first; brokers once a leader is elected, so they register at the first attempt
    instead of retrying against an electing quorum (on a loaded machine such retries could exhaust the
    broker's registration timeout).  Every wait shares ``timeout_s``.

    ``grow`` (a new dynamic cluster): the first controller starts alone as a one-voter quorum, the
    others start as observers and are added one at a time (:meth:`LocalCluster.grow_quorum`)."""
    deadline = time.monotonic() + timeout_s
    controllers = [node.node_id for node in cluster.spec.controllers]
    if grow:
        console = Console(stderr=True)
        with console.status("growing the quorum from controller 1…") as spinner:
            added = cluster.grow_quorum(
                timeout_s, on_status=lambda s: spinner.update(f"growing the quorum: {s.summary()}")
            )
        for name, offset in added:
            where = f" (VotersRecord at offset {offset})" if offset is not None else ""
            typer.echo(f"added {name} to the voters{where}", err=True)
    cluster.start(controllers)
    if cluster.spec.brokers:
        _wait_with_progress(
            lambda report: cluster.wait_until(
                lambda s: s.leader_id >= 0,
                timeout_s,
                what="a quorum leader",
                expect_running=controllers,
                on_status=report,
            ),
            "a quorum leader",
        )
        cluster.start()
    remaining_s = max(1.0, deadline - time.monotonic())
    return _wait_with_progress(
        lambda report: cluster.wait_healthy(remaining_s, on_status=report), "a healthy cluster"
    )


def _create_or_reopen(
    directory: Path,
    controllers: int | None,
    brokers: int | None,
    base_port: int | None,
    profile: str,
    metrics: bool,
    tls: bool = False,
    *,
    authorizer: bool = True,
    dynamic: bool = False,
) -> tuple[LocalCluster, bool]:
    """The cluster to start and whether it was created now (False: an existing, stopped one)."""
    try:
        existing = _open(directory)
    except ClusterError:
        return _use_security(
            LocalCluster.create(
                directory,
                controllers=3 if controllers is None else controllers,
                brokers=3 if brokers is None else brokers,
                base_port=base_port,
                profile=profile,
                metrics=metrics,
                tls=tls,
                authorizer=tls and authorizer,
                dynamic=dynamic,
            )
        ), True
    if dynamic and not existing.spec.dynamic:
        raise ClusterError(
            f"{existing.layout.root} holds a static quorum (controller.quorum.voters); use another --dir "
            "for --dynamic or `kraft cluster down --purge` it first"
        )
    if tls and not existing.spec.tls:
        raise ClusterError(
            f"{existing.layout.root} holds a PLAINTEXT cluster; use another --dir for --tls "
            "or `kraft cluster down --purge` it first"
        )
    if tls and not authorizer and existing.spec.authorizer:
        raise ClusterError(
            f"{existing.layout.root} holds a TLS cluster with an authorizer; use another --dir for "
            "--no-authorizer or `kraft cluster down --purge` it first"
        )
    running = existing.running()
    if running:
        pids = ", ".join(f"{name} pid {pid}" for name, pid in running.items())
        raise ClusterError(
            f"a cluster is already running in {existing.layout.root} ({pids}); "
            f"run `kraft cluster down --dir {directory}` first"
        )
    spec = existing.spec
    if (controllers is not None and controllers != len(spec.controllers)) or (
        brokers is not None and brokers != len(spec.brokers)
    ):
        raise ClusterError(
            f"{existing.layout.root} holds a cluster of {len(spec.controllers)} controllers and "
            f"{len(spec.brokers)} brokers; use another --dir or `kraft cluster down --purge` it first"
        )
    typer.echo(f"starting the existing cluster {spec.cluster_id} in {existing.layout.root}", err=True)
    return existing, False


@app.command("status")
@handle_errors
def status_command(
    directory: DirOption = _DEFAULT_DIR,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            max=MAX_WAIT_S,
            help="Seconds each node's answer may take (one that does not answer in time shows as starting).",
        ),
    ] = 1.0,
    as_json: JsonOption = False,
) -> None:
    """Show every node: pid, endpoint, state (leader/follower, active/fenced, stopped…) and log file.

    Examples:

      kraft cluster status --dir /tmp/c

      kraft cluster status --dir /tmp/c --json | jq .leader_id

      kraft cluster status --dir /tmp/c --timeout 5    # a loaded machine: give each node longer
    """
    try:
        status = _open(directory).status(timeout_s)
    except ClusterError as exc:
        raise _cluster_error(exc) from None
    _print_status(status, as_json)


@app.command("down")
@handle_errors
def down_command(
    directory: DirOption = _DEFAULT_DIR,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0.1, max=MAX_WAIT_S, help="Seconds between SIGTERM and SIGKILL.")
    ] = 15.0,
    purge: Annotated[
        bool, typer.Option("--purge", help="Also delete the directory (configs, data, logs).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Stop every node: brokers first, then controllers; SIGKILL whatever outlives --timeout.

    Examples:

      kraft cluster down --dir /tmp/c

      kraft cluster down --dir /tmp/c --purge     # also delete its files

      kraft cluster down --dir /tmp/c --json
    """
    try:
        cluster = _open(directory)
        with Console(stderr=True).status("stopping the brokers, then the controllers…"):
            outcomes = cluster.down(timeout_s)
    except ClusterError as exc:
        raise _cluster_error(exc) from None
    if purge:
        shutil.rmtree(cluster.layout.root)
    if as_json:
        print_json(
            {
                "nodes": [{"name": name, "outcome": outcome} for name, outcome in outcomes.items()],
                "removed": str(cluster.layout.root) if purge else None,
            }
        )
        return
    for name, outcome in outcomes.items():
        typer.echo(f"{name}: {outcome}")
    if purge:
        typer.echo(f"removed {cluster.layout.root}")


@app.command("restart")
@handle_errors
def restart_command(
    nodes: Annotated[
        list[str] | None,
        typer.Argument(
            help="Node ids (1, 101) or names (controller-1, broker-101); none: every node.",
            show_default=False,
        ),
    ] = None,
    directory: DirOption = _DEFAULT_DIR,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=1.0,
            max=MAX_WAIT_S,
            help="Seconds each node may take to stop and come back healthy.",
        ),
    ] = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Rolling restart: stop each node gracefully, start it, wait until it is healthy, then the next.

    With no ids every node, in Kafka's order: brokers, then the controllers
    that are not active, the active controller last (only from a healthy
    cluster).  Ids given are restarted in that same order.  Between nodes:
    grpc.health SERVING; a broker registered and unfenced; a controller
    back in the quorum with its log caught up to the high watermark.  A
    node not back within --timeout stops the roll with one error line.

    Examples:

      kraft cluster restart --dir /tmp/c           # every node, one at a time

      kraft cluster restart 101 --dir /tmp/c

      kraft cluster restart controller-2 broker-102 --dir /tmp/c --json
    """
    try:
        cluster = _open(directory)
        # WaitSpinner, not console.status: that one would redirect the per-node lines on stdout to stderr.
        with WaitSpinner("rolling restart…") as spinner:

            def restarted(node: Restarted) -> None:
                if not as_json:
                    with spinner.hidden():
                        typer.echo(node.describe())

            roll = RollingRestart(cluster, timeout_s, on_status=spinner.update, on_restarted=restarted)
            done = roll.run(nodes or None)
        status = cluster.status()
    except (ClusterError, ProcessError) as exc:
        raise CliError(str(exc)) from None
    if as_json:
        print_json({**status.as_json(), "restarted": [node.as_json() for node in done]})
        return
    _print_status(status, as_json=False)


NodesArgument = Annotated[
    list[str],
    typer.Argument(help="Node ids (1, 101) or names (controller-1, broker-101).", show_default=False),
]


@app.command("stop")
@handle_errors
def stop_command(
    nodes: NodesArgument,
    directory: DirOption = _DEFAULT_DIR,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0.1, max=MAX_WAIT_S, help="Seconds between SIGTERM and SIGKILL.")
    ] = 15.0,
    kill: Annotated[
        bool, typer.Option("--kill", help="SIGKILL at once: a crash, no graceful shutdown.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Stop some nodes: SIGTERM (graceful), or SIGKILL with --kill.

    On SIGTERM a broker does a controlled shutdown and an active
    controller resigns; --kill simulates a crash.

    Examples:

      kraft cluster stop 101 --dir demo-cluster

      kraft cluster stop controller-1 --kill --dir demo-cluster

      kraft cluster stop 101 102 --dir demo-cluster --json
    """
    stopped: list[dict[str, str]] = []
    try:
        cluster = _open(directory)
        procs = [cluster.process(node) for node in nodes]  # resolve every name before stopping any
        for proc in procs:
            if kill:
                outcome = "killed" if proc.kill() else "not running"
            else:
                with Console(stderr=True).status(f"stopping {proc.node.name}…"):
                    outcome = proc.stop(timeout_s)
            stopped.append({"name": proc.node.name, "outcome": outcome})
            if not as_json:
                typer.echo(f"{proc.node.name}: {outcome}")
    except (ClusterError, ProcessError) as exc:
        raise CliError(str(exc)) from None
    if as_json:
        print_json({"nodes": stopped})


@app.command("start")
@handle_errors
def start_command(
    nodes: NodesArgument,
    directory: DirOption = _DEFAULT_DIR,
    timeout_s: TimeoutOption = 60.0,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until each node is ready.")] = True,
    as_json: JsonOption = False,
) -> None:
    """Start stopped nodes of an existing cluster and wait until they are ready.

    Ready means: a controller follows or leads, a broker is unfenced
    (ACTIVE).  Nodes that already run are left alone.

    Examples:

      kraft cluster start 1 --dir demo-cluster

      kraft cluster start broker-101 broker-102 --dir /tmp/c --no-wait
    """
    try:
        cluster = _open(directory)
        names = [cluster.process(node).node.name for node in nodes]
        running = cluster.running()
        for name in names:
            if name in running:
                typer.echo(f"{name} is already running (pid {running[name]})", err=True)
        cluster.start(names)
        status = cluster.status()
        if wait:
            for name in names:
                status = _wait_with_progress(_node_ready_wait(cluster, name, timeout_s), name)
    except (ClusterError, ProcessError) as exc:
        raise CliError(str(exc)) from None
    _print_status(status, as_json)
