"""``kraft acl add | list | remove``: ACLs in the metadata log, kafka-acls.sh's options.

Resource: ``--topic NAME`` / ``--group NAME`` / ``--transactional-id NAME`` (repeatable) or ``--cluster``;
``--resource-pattern-type`` LITERAL (default) or PREFIXED (list/remove also take ANY and MATCH).
Entries: ``--allow-principal`` / ``--deny-principal`` (``User:NAME``, ``User:*``), ``--operation``
(Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs,
IdempotentWrite, All; repeatable), ``--host`` (default ``*``).  Every binding is validated here before
anything is sent, so a bad option writes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
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
    admin_client,
    bootstrap_from,
    handle_errors,
    print_json,
    print_table,
    run_async,
)
from kraft.client.admin import AdminClient
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.acl_control import binding_of, filter_of
from kraft.security.acl import (
    CLUSTER_RESOURCE_NAME,
    WILDCARD,
    AclError,
    AclFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
    parse_enum,
    validate_acl,
)
from kraft.v1 import controller_pb2 as cpb

app = typer.Typer(no_args_is_help=True, help="ACLs: add, list, remove (kafka-acls.sh).")

TopicOption = Annotated[
    list[str] | None, typer.Option("--topic", help="A topic (repeatable; '*' = every topic).")
]
GroupOption = Annotated[list[str] | None, typer.Option("--group", help="A consumer group (repeatable).")]
TransactionalIdOption = Annotated[
    list[str] | None, typer.Option("--transactional-id", help="A transactional id (repeatable).")
]
ClusterOption = Annotated[bool, typer.Option("--cluster", help="The cluster resource.")]
PatternOption = Annotated[
    str | None,
    typer.Option(
        "--resource-pattern-type",
        help="literal or prefixed (list/remove also: any, match).  Default: literal.",
        show_default=False,
    ),
]
AllowOption = Annotated[
    list[str] | None, typer.Option("--allow-principal", help="User:NAME to allow (repeatable).")
]
DenyOption = Annotated[
    list[str] | None, typer.Option("--deny-principal", help="User:NAME to deny (repeatable).")
]
OperationOption = Annotated[
    list[str] | None,
    typer.Option("--operation", help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, All, …"),
]
HostOption = Annotated[str | None, typer.Option("--host", help="Client address the entry applies to ('*').")]


def _client(bootstrap: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> AdminClient:
    return admin_client(bootstrap, timeout_s)


def resources(
    topics: Sequence[str], groups: Sequence[str], transactional_ids: Sequence[str], cluster: bool
) -> list[tuple[ResourceType, str]]:
    found = [(ResourceType.TOPIC, t) for t in topics]
    found += [(ResourceType.GROUP, g) for g in groups]
    found += [(ResourceType.TRANSACTIONAL_ID, t) for t in transactional_ids]
    if cluster:
        found.append((ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME))
    return found


def _pattern(text: str | None, *, filters: bool) -> PatternType:
    if text is None:
        return PatternType.LITERAL
    try:
        pattern = parse_enum(PatternType, text)
    except AclError as exc:
        raise CliError(f"--resource-pattern-type: {exc}") from None
    allowed = (PatternType.LITERAL, PatternType.PREFIXED) + (
        (PatternType.ANY, PatternType.MATCH) if filters else ()
    )
    if pattern not in allowed:
        names = ", ".join(p.name.lower() for p in allowed)
        raise CliError(f"--resource-pattern-type {text!r}: must be one of {names}")
    return pattern


def _operations(texts: Sequence[str]) -> list[AclOperation]:
    operations: list[AclOperation] = []
    for text in texts:
        try:
            operation = parse_enum(AclOperation, text)
        except AclError as exc:
            raise CliError(f"--operation: {exc}") from None
        if operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise CliError(f"--operation {text!r} is not an operation")
        operations.append(operation)
    return operations


def entries(allow: Sequence[str], deny: Sequence[str]) -> list[tuple[str, AclPermissionType]]:
    return [(p, AclPermissionType.ALLOW) for p in allow] + [(p, AclPermissionType.DENY) for p in deny]


def build_acls(
    targets: Sequence[tuple[ResourceType, str]],
    pattern: PatternType,
    principals: Sequence[tuple[str, AclPermissionType]],
    operations: Sequence[AclOperation],
    host: str,
) -> list[StandardAcl]:
    """Every (resource, principal, operation) binding, validated (CliError naming the first bad one)."""
    if not targets:
        raise CliError("name a resource: --topic, --group, --transactional-id or --cluster")
    if not principals:
        raise CliError("name a principal: --allow-principal or --deny-principal")
    if not operations:
        raise CliError("name an operation: --operation (e.g. Read, Write, Describe, All)")
    acls = []
    for (rtype, name), (principal, permission), operation in itertools.product(
        targets, principals, operations
    ):
        acl = StandardAcl(rtype, name, pattern, principal, host, operation, permission)
        try:
            validate_acl(acl)
        except AclError as exc:
            raise CliError(f"invalid ACL ({acl}): {exc}") from None
        acls.append(acl)
    return acls


def build_filters(
    targets: Sequence[tuple[ResourceType, str]],
    pattern: PatternType | None,
    principals: Sequence[tuple[str, AclPermissionType]],
    operations: Sequence[AclOperation],
    host: str | None,
) -> list[AclFilter]:
    """Filters for list/remove: unnamed parts match anything (no resource = every resource)."""
    resource_parts: list[tuple[ResourceType, str | None, PatternType]] = (
        [(rtype, name, pattern or PatternType.LITERAL) for rtype, name in targets]
        if targets
        else [(ResourceType.ANY, None, pattern or PatternType.ANY)]
    )
    principal_parts: list[tuple[str | None, AclPermissionType]] = list(principals) or [
        (None, AclPermissionType.ANY)
    ]
    operation_parts = list(operations) or [AclOperation.ANY]
    filters = []
    for (rtype, name, pat), (principal, permission), operation in itertools.product(
        resource_parts, principal_parts, operation_parts
    ):
        acl_filter = AclFilter(rtype, name, pat, principal, host, operation, permission)
        try:
            acl_filter.validate()
        except AclError as exc:
            raise CliError(str(exc)) from None
        filters.append(acl_filter)
    return filters


def acl_json(description: cpb.AclDescription) -> dict[str, Any]:
    b = description.binding
    return {
        "id": description.id,
        "resource_type": _name(ResourceType, b.resource_type),
        "resource_name": b.resource_name,
        "pattern_type": _name(PatternType, b.pattern_type),
        "principal": b.principal,
        "host": b.host,
        "operation": _name(AclOperation, b.operation),
        "permission_type": _name(AclPermissionType, b.permission_type),
    }


def _name(kind: Any, value: int) -> str:
    try:
        return str(kind(value).name)
    except ValueError:
        return str(value)


def _describe(acl_json_row: dict[str, Any]) -> str:
    r = acl_json_row
    return (
        f"{r['permission_type']} {r['principal']} {r['operation']} from {r['host']} on "
        f"{r['resource_type']}:{r['pattern_type']}:{r['resource_name']}"
    )


async def _add(
    bootstrap: str, acls: list[StandardAcl], timeout_s: float = DEFAULT_TIMEOUT_S
) -> cpb.CreateAclsResponse:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        return await client.create_acls([binding_of(a) for a in acls])


async def _list(
    bootstrap: str, filters: list[AclFilter], timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[cpb.AclDescription]:
    found: dict[str, cpb.AclDescription] = {}
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        for acl_filter in filters:
            for description in await client.describe_acls(filter_of(acl_filter)):
                found.setdefault(description.id, description)
    return list(found.values())


async def _remove(
    bootstrap: str, filters: list[AclFilter], timeout_s: float = DEFAULT_TIMEOUT_S
) -> cpb.DeleteAclsResponse:
    async with _client(bootstrap, timeout_s=timeout_s) as client:
        return await client.delete_acls([filter_of(f) for f in filters])


@app.command("add")
@handle_errors
def add_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    allow_principal: AllowOption = None,
    deny_principal: DenyOption = None,
    operation: OperationOption = None,
    topic: TopicOption = None,
    group: GroupOption = None,
    transactional_id: TransactionalIdOption = None,
    cluster: ClusterOption = False,
    resource_pattern_type: PatternOption = None,
    host: HostOption = None,
    command_config: CommandConfigOption = None,
    json_output: JsonOption = False,
) -> None:
    """Add ACLs: one for every principal, operation and resource named.

    Examples:

      kraft acl add --bootstrap-controller 127.0.0.1:9093 --allow-principal User:alice \\
        --operation Read --operation Write --topic orders

      kraft acl add --bootstrap-controller 127.0.0.1:9093 --allow-principal User:etl \\
        --operation All --topic etl- --resource-pattern-type prefixed

      kraft acl add --bootstrap-controller 127.0.0.1:9093 --allow-principal User:broker-101 \\
        --operation ClusterAction --cluster

      kraft acl add --bootstrap-controller 127.0.0.1:9093 --command-config DIR/client.properties \\
        --allow-principal 'User:CN=alice,O=kraft' --operation Write --topic t

      kraft acl add --cluster-dir /tmp/c --allow-principal User:bob --operation Read --topic t --json
    """
    acls = build_acls(
        resources(topic or [], group or [], transactional_id or [], cluster),
        _pattern(resource_pattern_type, filters=False),
        entries(allow_principal or [], deny_principal or []),
        _operations(operation or []),
        host or WILDCARD,
    )
    response = run_async(_add(bootstrap_from(bootstrap_controller, cluster_dir), acls, timeout_s=timeout))
    failures = []
    added: list[dict[str, Any]] = []
    for acl, result in zip(acls, response.results, strict=True):
        if result.error_code != ErrorCode.NONE:
            failures.append((acl, result))
            continue
        added.append(acl_json(cpb.AclDescription(id=result.id, binding=binding_of(acl))))
        if not json_output:
            typer.echo(f"ACL {result.id}: {acl}")
    if json_output:
        # Printed before a partial failure's error line, so a script sees what was added.
        print_json(
            {
                "added": added,
                "failed": [
                    {
                        "acl": str(acl),
                        "error_code": ErrorCode.from_wire(result.error_code).name,
                        "error_message": result.error_message,
                    }
                    for acl, result in failures
                ],
            }
        )
    if failures:
        acl, result = failures[0]
        raise KraftError(
            ErrorCode.from_wire(result.error_code),
            f"{len(failures)} of {len(acls)} ACLs not added; first: {acl}: {result.error_message}",
        )


@app.command("list")
@handle_errors
def list_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    topic: TopicOption = None,
    group: GroupOption = None,
    transactional_id: TransactionalIdOption = None,
    cluster: ClusterOption = False,
    resource_pattern_type: PatternOption = None,
    principal: Annotated[list[str] | None, typer.Option("--principal", help="Only this principal's.")] = None,
    json_output: JsonOption = False,
    command_config: CommandConfigOption = None,
) -> None:
    """List ACLs (all, or those of the resources / principals named).

    Examples:

      kraft acl list --bootstrap-controller 127.0.0.1:9093

      kraft acl list --bootstrap-controller 127.0.0.1:9093 --topic orders --resource-pattern-type match --json
    """
    filters = build_filters(
        resources(topic or [], group or [], transactional_id or [], cluster),
        None if resource_pattern_type is None else _pattern(resource_pattern_type, filters=True),
        [(p, AclPermissionType.ANY) for p in principal or []],
        [],
        None,
    )
    rows = [
        acl_json(d)
        for d in run_async(
            _list(bootstrap_from(bootstrap_controller, cluster_dir), filters, timeout_s=timeout)
        )
    ]
    rows.sort(key=lambda r: (r["resource_type"], r["resource_name"], r["principal"], r["id"]))
    if json_output:
        print_json(rows)
        return
    columns = ["id", "principal", "permission_type", "operation", "host", "resource_type", "pattern_type"]
    columns.append("resource_name")
    print_table(columns, [[r[c] for c in columns] for r in rows])


@app.command("remove")
@handle_errors
def remove_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    allow_principal: AllowOption = None,
    deny_principal: DenyOption = None,
    operation: OperationOption = None,
    topic: TopicOption = None,
    group: GroupOption = None,
    transactional_id: TransactionalIdOption = None,
    cluster: ClusterOption = False,
    resource_pattern_type: PatternOption = None,
    host: HostOption = None,
    command_config: CommandConfigOption = None,
    json_output: JsonOption = False,
) -> None:
    """Remove the ACLs of the resources named (only the principals / operations / host named, if any).

    Examples:

      kraft acl remove --bootstrap-controller 127.0.0.1:9093 --allow-principal User:alice \\
        --operation Write --topic orders

      kraft acl remove --bootstrap-controller 127.0.0.1:9093 --topic orders

      kraft acl remove --cluster-dir /tmp/c --topic orders --json
    """
    targets = resources(topic or [], group or [], transactional_id or [], cluster)
    if not targets:
        raise CliError("name a resource: --topic, --group, --transactional-id or --cluster")
    filters = build_filters(
        targets,
        _pattern(resource_pattern_type, filters=True),
        entries(allow_principal or [], deny_principal or []),
        _operations(operation or []),
        host,
    )
    response = run_async(
        _remove(bootstrap_from(bootstrap_controller, cluster_dir), filters, timeout_s=timeout)
    )
    removed: list[dict[str, Any]] = []
    for result in response.filter_results:
        if result.error_code != ErrorCode.NONE:
            raise KraftError(ErrorCode.from_wire(result.error_code), result.error_message)
        for description in result.matching_acls:
            removed.append(acl_json(description))
            if not json_output:
                typer.echo(f"removed ACL {description.id}: {_describe(removed[-1])}")
    if json_output:
        print_json({"removed": removed, "count": len(removed)})
        return
    typer.echo(f"{len(removed)} ACL{'s' if len(removed) != 1 else ''} removed")
