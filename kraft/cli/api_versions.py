"""``kraft api-versions`` (the purpose of kafka-broker-api-versions.sh): what each node serves.

kraft speaks gRPC, so there are no api keys with version ranges; what answers the same operator questions —
"will this command work against that node", "did every node get the upgrade" — is, per node, the kraft
version it runs, the gRPC services and methods it serves (an older node lacks the newer methods) and the
``metadata.version`` it supports next to the level finalized in its image (Kafka's ApiVersions also
carries the supported and finalized features).  See :mod:`kraft.api_versions`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import grpc
import typer

from kraft.cli.common import (
    DEFAULT_TIMEOUT_S,
    CliError,
    ClusterDirOption,
    CommandConfigOption,
    JsonOption,
    OptionalBootstrapControllerOption,
    TimeoutOption,
    bootstrap_from,
    handle_errors,
    parse_bootstrap,
    print_json,
    request_timeout_s,
    run_async,
)
from kraft.client.channel import open_channel
from kraft.errors import ErrorCode
from kraft.v1 import broker_pb2_grpc, common_pb2, controller_pb2_grpc


def node_json(
    role: str, target: str, answer: common_pb2.ApiVersionsResponse | None, error: str | None
) -> dict[str, Any]:
    if answer is None:
        return {"role": role, "endpoint": target, "node_id": None, "error": error}
    return {
        "role": answer.role or role,
        "endpoint": target,
        "node_id": answer.node_id,
        "error": error,
        "software_version": answer.software_version or None,
        "services": {s.name: list(s.methods) for s in answer.services},
        "supported_features": {f.name: [f.min_version, f.max_version] for f in answer.supported_features},
        "finalized_features": {f.name: f.level for f in answer.finalized_features},
    }


async def ask_node(role: str, target: str, timeout_s: float) -> dict[str, Any]:
    """ApiVersions of one node; the cluster id is learned from the node's own refusal of an empty one."""
    channel = open_channel(target)
    try:
        stub: Any = (
            controller_pb2_grpc.ControllerServiceStub(channel)
            if role == "controller"
            else broker_pb2_grpc.BrokerServiceStub(channel)
        )
        request = common_pb2.ApiVersionsRequest()
        try:
            answer: common_pb2.ApiVersionsResponse = await stub.ApiVersions(request, timeout=timeout_s)
            if answer.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID and answer.cluster_id:
                request.cluster_id = answer.cluster_id
                answer = await stub.ApiVersions(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.UNIMPLEMENTED:
                return node_json(
                    role, target, None, f"serves no {role} ApiVersions (an older kraft, or not a {role})"
                )
            return node_json(role, target, None, f"{err.code().name}: {err.details()}")
        code = ErrorCode.from_wire(answer.error_code)
        return node_json(
            role, target, answer, None if code is ErrorCode.NONE else f"{code.name}: {answer.error_message}"
        )
    finally:
        await channel.close(None)


async def _ask_all(nodes: list[tuple[str, str]], timeout_s: float) -> list[dict[str, Any]]:
    """Every node at once, each RPC at most ``request.timeout.ms`` cut to ``timeout_s``: a hung node costs
    the command one request timeout (asked one after another with the whole ``--timeout`` each, two hung
    nodes took twice the ``--timeout``)."""
    attempt_s = min(request_timeout_s(), timeout_s)
    return list(await asyncio.gather(*(ask_node(role, target, attempt_s) for role, target in nodes)))


@handle_errors
def api_versions_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    bootstrap_server: Annotated[
        str | None,
        typer.Option("--bootstrap-server", help="Broker endpoint(s): host:port[,…].", show_default=False),
    ] = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per node: kraft version, the gRPC services and methods it serves, and metadata.version (supported
    range, finalized level) — what kafka-broker-api-versions.sh tells a Kafka operator.

    Every listed endpoint is asked (with --cluster-dir and no endpoints: every node of the local cluster).
    Exit status 1 when a node could not answer (the others are still printed).

    Examples:

      kraft api-versions --bootstrap-server 127.0.0.1:9092,127.0.0.1:9094

      kraft api-versions --cluster-dir /tmp/c --json
    """
    nodes: list[tuple[str, str]] = []
    if bootstrap_controller is None and bootstrap_server is None:
        controllers = bootstrap_from(None, cluster_dir)
        nodes += [("controller", hp.target) for hp in parse_bootstrap(controllers)]
        try:
            brokers = bootstrap_from(None, cluster_dir, brokers=True)
        except CliError:
            brokers = ""  # a cluster without brokers
        nodes += (
            [("broker", hp.target) for hp in parse_bootstrap(brokers, "--bootstrap-server")]
            if brokers
            else []
        )
    else:
        if bootstrap_controller is not None:
            nodes += [("controller", hp.target) for hp in parse_bootstrap(bootstrap_controller)]
        if bootstrap_server is not None:
            nodes += [("broker", hp.target) for hp in parse_bootstrap(bootstrap_server, "--bootstrap-server")]
    results = run_async(_ask_all(nodes, timeout))
    if as_json:
        print_json(results)
    else:
        for i, node in enumerate(results):
            if i:
                typer.echo("")
            node_id = "?" if node["node_id"] is None else node["node_id"]
            name = f"{node['role']} {node_id} ({node['endpoint']})"
            if node["error"] and "services" not in node:
                typer.echo(f"{name}: {node['error']}")
                continue
            features = ", ".join(
                f"{n} {node['finalized_features'].get(n, '-')} (supported {lo}..{hi})"
                for n, (lo, hi) in node["supported_features"].items()
            )
            typer.echo(f"{name}: kraft {node['software_version']}, {features}")
            for service, methods in node["services"].items():
                typer.echo(f"  {service}: {', '.join(methods)}")
    failed = [n for n in results if n["error"]]
    if failed:
        raise CliError(
            f"{len(failed)} of {len(results)} nodes did not answer; "
            f"{failed[0]['endpoint']}: {failed[0]['error']}"
        )
