"""``kraft config describe | alter``: topic and dynamic broker configs (kafka-configs.sh).

Configs are ConfigRecords in the metadata log, written through the active controller with Kafka's
IncrementalAlterConfigs (``--add-config`` = SET, ``--delete-config`` = DELETE) and read with DescribeConfigs.
What may be set and what brokers apply: :mod:`kraft.metadata.config_catalog` and docs/operations.md.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    VerboseOption,
    admin_client,
    bootstrap_from,
    handle_errors,
    print_json,
    print_table,
    run_async,
)
from kraft.client.admin import AdminClient
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb

app = typer.Typer(
    no_args_is_help=True, help="Topic and dynamic broker configs: describe, alter (kafka-configs.sh)."
)

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
ENTITY_TYPES = {"topics": TOPIC_RESOURCE, "brokers": BROKER_RESOURCE}
OP_SET = 0
OP_DELETE = 1
OWN_SOURCES = {
    TOPIC_RESOURCE: "DYNAMIC_TOPIC_CONFIG",
    BROKER_RESOURCE: "DYNAMIC_BROKER_CONFIG",
}

EntityTypeOption = Annotated[
    str, typer.Option("--entity-type", help="topics or brokers.", show_default=False)
]
EntityNameOption = Annotated[
    str | None,
    typer.Option("--entity-name", help="The topic name, or the broker id.", show_default=False),
]
EntityDefaultOption = Annotated[
    bool,
    typer.Option(
        "--entity-default", help="Brokers only: the cluster-wide default every broker uses (no broker id)."
    ),
]


@dataclass(frozen=True, slots=True)
class Entity:
    type_name: str  # topics | brokers
    resource_type: int
    name: str  # "" = the brokers' cluster-wide default

    @property
    def label(self) -> str:
        if self.resource_type == TOPIC_RESOURCE:
            return f"topic {self.name}"
        return f"broker {self.name}" if self.name else "the default of every broker"

    def resource(self) -> cpb.ConfigResource:
        return cpb.ConfigResource(resource_type=self.resource_type, resource_name=self.name)

    @property
    def own_source(self) -> str:
        if self.resource_type == BROKER_RESOURCE and not self.name:
            return "DYNAMIC_DEFAULT_BROKER_CONFIG"
        return OWN_SOURCES[self.resource_type]


def parse_entity(entity_type: str, name: str | None, default: bool) -> Entity:
    """``--entity-type``/``--entity-name``/``--entity-default`` → the resource, or :class:`CliError`."""
    resource_type = ENTITY_TYPES.get(entity_type)
    if resource_type is None:
        raise CliError(f"--entity-type {entity_type!r} is not one of: {', '.join(ENTITY_TYPES)}")
    if default:
        if resource_type != BROKER_RESOURCE:
            raise CliError("--entity-default is for --entity-type brokers only")
        if name is not None:
            raise CliError("give --entity-name or --entity-default, not both")
        return Entity(entity_type, resource_type, "")
    if not name:
        hint = " (or --entity-default)" if resource_type == BROKER_RESOURCE else ""
        raise CliError(f"--entity-name is required for --entity-type {entity_type}{hint}")
    if resource_type == BROKER_RESOURCE and not (name.isdigit() and name.isascii()):
        raise CliError(f"--entity-name {name!r} is not a broker id")
    return Entity(entity_type, resource_type, name)


def split_config_list(text: str, option: str) -> list[str]:
    """Split on commas outside square brackets (kafka-configs.sh: ``cleanup.policy=[compact,delete]``)."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise CliError(f"{option} {text!r}: ']' without '['")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise CliError(f"{option} {text!r}: '[' without ']'")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def parse_add_configs(texts: list[str]) -> dict[str, str]:
    """``k=v,k2=[a,b]`` (repeatable) → {k: v, k2: "a,b"}; a key twice or an item without '=' is refused."""
    configs: dict[str, str] = {}
    for text in texts:
        for item in split_config_list(text, "--add-config"):
            name, sep, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not name:
                raise CliError(f"--add-config item {item!r} is not key=value")
            if value.startswith("[") and value.endswith("]"):
                value = ",".join(v.strip() for v in value[1:-1].split(","))
            if name in configs:
                raise CliError(f"--add-config sets {name} twice")
            configs[name] = value
    return configs


def parse_delete_configs(texts: list[str]) -> list[str]:
    names: list[str] = []
    for text in texts:
        for name in split_config_list(text, "--delete-config"):
            if "=" in name:
                raise CliError(f"--delete-config takes names only, got {name!r}")
            if name not in names:
                names.append(name)
    return names


def alter_resource(entity: Entity, add: dict[str, str], delete: list[str]) -> cpb.AlterConfigsResource:
    both = sorted(set(add) & set(delete))
    if both:
        raise CliError(f"{', '.join(both)}: both in --add-config and --delete-config")
    if not add and not delete:
        raise CliError("nothing to alter: give --add-config and/or --delete-config")
    resource = cpb.AlterConfigsResource(resource=entity.resource())
    for name, value in add.items():
        resource.configs.add(name=name, op=OP_SET, value=value)
    for name in delete:
        resource.configs.add(name=name, op=OP_DELETE)
    return resource


def entry_json(entry: cpb.ConfigEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "value": entry.value if entry.HasField("value") else None,
        "source": entry.source,
        "applied": entry.applied,
        "read_only": entry.read_only,
    }


def describe_json(entity: Entity, entries: list[cpb.ConfigEntry], everything: bool) -> dict[str, Any]:
    """The ``config describe --json`` object: the resource's own (dynamic) configs, or with ``everything``
    every known key with its effective value and source."""
    shown = [e for e in entries if everything or e.source == entity.own_source]
    return {
        "entity_type": entity.type_name,
        "entity_name": entity.name or None,
        "configs": [entry_json(e) for e in shown],
    }


def _client(bootstrap: str, verbose: bool, timeout_s: float) -> AdminClient:
    return admin_client(bootstrap, timeout_s, verbose)


async def _describe(bootstrap: str, entity: Entity, timeout_s: float) -> cpb.DescribeConfigsResult:
    async with _client(bootstrap, False, timeout_s) as client:
        response = await client.describe_configs([cpb.DescribeConfigsResource(resource=entity.resource())])
    return response.results[0]


async def _alter(
    bootstrap: str, resource: cpb.AlterConfigsResource, validate_only: bool, verbose: bool, timeout_s: float
) -> cpb.AlterConfigsResourceResult:
    async with _client(bootstrap, verbose, timeout_s) as client:
        response = await client.incremental_alter_configs([resource], validate_only)
    return response.results[0]


@app.command("describe")
@handle_errors
def describe_command(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    everything: Annotated[
        bool,
        typer.Option(
            "--all", help="Every known config with its effective value and source, not only overrides."
        ),
    ] = False,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """The configs set on a topic or broker (kafka-configs.sh --describe).

    Without --all only the values set on this entity are listed; with --all every config kraft knows for
    the entity type, with its source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG, or STATIC_BROKER_CONFIG: each broker's .properties) and
    whether brokers apply it (Applied = no: stored and shown only).

    Examples:

      kraft config describe --bootstrap-controller 127.0.0.1:9093 --entity-type topics --entity-name orders

      kraft config describe --cluster-dir /tmp/c --entity-type brokers --entity-name 101 --all --json

      kraft config describe --cluster-dir /tmp/c --entity-type brokers --entity-default
    """
    entity = parse_entity(entity_type, entity_name, entity_default)
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    result = run_async(_describe(bootstrap, entity, timeout))
    code = ErrorCode.from_wire(result.error_code)
    if code != ErrorCode.NONE:
        raise KraftError(code, result.error_message)
    described = describe_json(entity, list(result.configs), everything)
    if as_json:
        print_json(described)
        return
    configs = described["configs"]
    if not configs:
        typer.echo(f"no dynamic configs set for {entity.label} (--all shows every config)")
        return
    print_table(
        ["Name", "Value", "Source", "Applied"],
        [[c["name"], c["value"], c["source"], "yes" if c["applied"] else "no"] for c in configs],
        title=f"configs of {entity.label}",
    )


@app.command("alter")
@handle_errors
def alter_command(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    add_config: Annotated[
        list[str] | None,
        typer.Option(
            "--add-config",
            help="k=v[,k=v…] to set; a list value in brackets: cleanup.policy=[compact,delete].",
            show_default=False,
        ),
    ] = None,
    delete_config: Annotated[
        list[str] | None,
        typer.Option("--delete-config", help="k[,k…] to remove (back to the default).", show_default=False),
    ] = None,
    validate_only: Annotated[
        bool, typer.Option("--validate-only", help="Check only; change nothing.")
    ] = False,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Set or remove configs of a topic or broker, incrementally (kafka-configs.sh --alter).

    Every key and value is checked by the controller against the known configs first; one bad one
    changes nothing.  Broker configs: only the dynamic ones (message.max.bytes, min.insync.replicas,
    unclean.leader.election.enable), per broker (--entity-name ID) or for every broker (--entity-default);
    brokers apply them at once, the controller the election ones.  Turning unclean.leader.election.enable
    on elects a live replica for every offline partition it covers at once (records may be lost).

    Examples:

      kraft config alter --bootstrap-controller 127.0.0.1:9093 --entity-type topics --entity-name orders \\
          --add-config retention.ms=86400000,min.insync.replicas=2

      kraft config alter --cluster-dir /tmp/c --entity-type topics --entity-name orders \\
          --delete-config retention.ms

      kraft config alter --cluster-dir /tmp/c --entity-type brokers --entity-default \\
          --add-config message.max.bytes=2097152
    """
    entity = parse_entity(entity_type, entity_name, entity_default)
    add = parse_add_configs(list(add_config or []))
    delete = parse_delete_configs(list(delete_config or []))
    resource = alter_resource(entity, add, delete)
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    result = run_async(_alter(bootstrap, resource, validate_only, verbose, timeout))
    code = ErrorCode.from_wire(result.error_code)
    if code != ErrorCode.NONE:
        raise KraftError(code, result.error_message)
    if as_json:
        print_json(
            {
                "entity_type": entity.type_name,
                "entity_name": entity.name or None,
                "result": "validated" if validate_only else "altered",
                "set": add,
                "deleted": delete,
            }
        )
        return
    parts = [f"set {', '.join(f'{k}={v}' for k, v in add.items())}"] if add else []
    if delete:
        parts.append(f"deleted {', '.join(delete)}")
    verb = "would be altered" if validate_only else "altered"
    typer.echo(f"configs of {entity.label} {verb}: {'; '.join(parts)}")
