"""``kraft health``: grpc.health.v1 Check of one node, a list of nodes, or every node of a local cluster.

What is checked per node (docs/operations.md, "Health at a glance"):

- a controller (``--bootstrap-controller``, or a controller of ``--dir``): ``""`` (the process is up) and
  ``kraft.v1.RaftService`` (it knows the quorum leader);
- a broker (``--bootstrap-server``, or a broker of ``--dir``): ``""`` and ``kraft.v1.BrokerService`` (it is
  unfenced and serves clients);
- ``--target host:port`` (any node): ``""`` only;

or, with ``--service NAME``, that one service everywhere.  Every check is one bounded call, all in
parallel.  Exit 0 when every check answered SERVING; otherwise the table (or JSON) is still printed and
one ``error:`` line on stderr names what is not serving, exit 1.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from kraft.cli.common import (
    MAX_WAIT_S,
    CliError,
    CommandConfigOption,
    JsonOption,
    handle_errors,
    parse_bootstrap,
    print_json,
    print_table,
    run_async,
)
from kraft.observability.health import (
    BROKER_SERVICE,
    OVERALL,
    RAFT_SERVICE,
    HealthStatus,
    check_health,
)

_COLUMNS = ["node", "role", "target", "service", "status"]
_ROLE_SERVICES = {
    "controller": (OVERALL, RAFT_SERVICE),
    "broker": (OVERALL, BROKER_SERVICE),
    "node": (OVERALL,),
}


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    role: str
    """``controller``, ``broker``, or ``node`` (a bare ``--target``: role unknown)."""
    target: str


@dataclass(frozen=True, slots=True)
class Check:
    node: Node
    service: str
    status: HealthStatus

    def as_json(self) -> dict[str, Any]:
        return {
            "node": self.node.name,
            "role": self.node.role,
            "target": self.node.target,
            "service": self.service,
            "status": str(self.status),
        }


def nodes_to_check(
    targets: list[str], bootstrap_controller: str | None, bootstrap_server: str | None, directory: Path | None
) -> list[Node]:
    """The nodes named on the command line, or else every node of the cluster directory."""
    nodes = [
        Node(target, "node", target) for target in (parse_bootstrap(t, "--target")[0].target for t in targets)
    ]
    if bootstrap_controller:
        endpoints = parse_bootstrap(bootstrap_controller)
        nodes += [Node(e.target, "controller", e.target) for e in endpoints]
    if bootstrap_server:
        endpoints = parse_bootstrap(bootstrap_server, "--bootstrap-server")
        nodes += [Node(e.target, "broker", e.target) for e in endpoints]
    if nodes:
        return nodes
    if directory is None:
        raise CliError("give --target, --bootstrap-controller, --bootstrap-server or --dir (a local cluster)")
    # Imported here: the cluster manager is only needed for --dir.
    from kraft.client.channel import set_default_security
    from kraft.cluster.manager import ClusterError, LocalCluster

    try:
        cluster = LocalCluster.open(directory)
    except ClusterError as exc:
        raise CliError(str(exc)) from None
    set_default_security(cluster.client_security())
    return [Node(n.name, str(n.role), n.target) for n in cluster.spec.nodes]


async def run_checks(nodes: list[Node], service: str | None, timeout_s: float) -> list[Check]:
    """Every (node, service) check at once, each bounded by ``timeout_s``."""
    pairs = [
        (node, s)
        for node in nodes
        for s in ((service,) if service is not None else _ROLE_SERVICES[node.role])
    ]
    statuses = await asyncio.gather(*(check_health(node.target, s, timeout_s) for node, s in pairs))
    return [Check(node, s, status) for (node, s), status in zip(pairs, statuses, strict=True)]


def _service_label(service: str) -> str:
    return service or '""'


@handle_errors
def health_command(
    target: Annotated[
        list[str] | None,
        typer.Option("--target", help="A node's host:port (any role); repeatable.", show_default=False),
    ] = None,
    bootstrap_controller: Annotated[
        str | None,
        typer.Option(
            "--bootstrap-controller", help="Controllers: host:port[,host:port…].", show_default=False
        ),
    ] = None,
    bootstrap_server: Annotated[
        str | None,
        typer.Option("--bootstrap-server", help="Brokers: host:port[,host:port…].", show_default=False),
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            "-d",
            "--cluster-dir",
            envvar="KRAFT_CLUSTER_DIR",
            help="A local cluster directory: check every node (when no endpoint is given); --cluster-dir "
            "as the other commands spell it.",
            show_default=False,
        ),
    ] = None,
    service: Annotated[
        str | None,
        typer.Option(
            "--service",
            help='Check only this service name ("" = the process; kraft.v1.RaftService, '
            "kraft.v1.ControllerService, kraft.v1.BrokerService).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, max=MAX_WAIT_S, help="Seconds per check.")
    ] = 2.0,
    as_json: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """grpc.health.v1 Check of nodes; exit 1 unless every check is SERVING.

    Controllers: the process and kraft.v1.RaftService (knows the leader).
    Brokers: the process and kraft.v1.BrokerService (unfenced).

    Examples:

      kraft health --dir /tmp/c        # or --cluster-dir /tmp/c, or KRAFT_CLUSTER_DIR=/tmp/c

      kraft health --bootstrap-controller h1:9093,h2:9093,h3:9093 --json

      kraft health --target 127.0.0.1:9092 --service kraft.v1.BrokerService
    """
    nodes = nodes_to_check(list(target or []), bootstrap_controller, bootstrap_server, directory)
    checks = run_async(run_checks(nodes, service, timeout))
    failed = [c for c in checks if c.status is not HealthStatus.SERVING]
    if as_json:
        print_json({"healthy": not failed, "checks": [c.as_json() for c in checks]})
    else:
        rows = [
            [c.node.name, c.node.role, c.node.target, _service_label(c.service), str(c.status)]
            for c in checks
        ]
        print_table(_COLUMNS, rows)
    if failed:
        listed = ", ".join(f"{c.node.name} {_service_label(c.service)} {c.status}" for c in failed)
        raise CliError(f"{len(failed)} of {len(checks)} health checks not SERVING: {listed}")
