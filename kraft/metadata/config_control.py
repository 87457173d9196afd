"""DescribeConfigs / IncrementalAlterConfigs on the active controller (Kafka's ConfigurationControlManager).

Configs live in the metadata log as ConfigRecords (value absent = deleted), replayed into the image's
``configs`` like every other record, stored in snapshots and in every broker's image store.  What may be
set, and what brokers apply, is :mod:`kraft.metadata.config_catalog`.

IncrementalAlterConfigs is per resource, as in Kafka: every operation on a resource is validated first
(unknown key, static broker key, bad value, duplicate name, APPEND/SUBTRACT on a non-list key, and the
topic's cross-key rule min.insync.replicas ≤ replication factor on the result), then all of that resource's
ConfigRecords are written in one batch — or none, and the resource's result carries the error.  A
per-broker ``min.insync.replicas`` (``--entity-name N``) is refused (INVALID_CONFIG; deleting one is
allowed): ELR is always on, and its rules need every broker to resolve the minimum as the controller does
(topic, else cluster-wide default — Kafka refuses it too once ELR is enabled).  A changed
``min.insync.replicas`` (a topic's, or the cluster-wide default) clears the ELR and last known ELR of the
partitions it governs in that same batch (KIP-966; :meth:`ControllerLogic.clear_elr`); turning
``unclean.leader.election.enable`` on elects the offline partitions it concerns.  The request
is bounded before any work (``MAX_CONFIG_RESOURCES_PER_REQUEST`` resources, POLICY_VIOLATION).  Setting a
key to its current value writes nothing; the operation is idempotent, so clients may resend it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from kraft.config import NodeConfig
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.config_catalog import (
    BROKER_DYNAMIC_CONFIGS,
    MAX_CONFIG_OPS_PER_RESOURCE,
    MAX_CONFIG_RESOURCES_PER_REQUEST,
    SOURCE_BROKER,
    SOURCE_DEFAULT,
    SOURCE_DEFAULT_BROKER,
    SOURCE_STATIC,
    SOURCE_TOPIC,
    ConfigSpec,
    apply_ops,
    check_broker_name,
    check_topic_result,
    specs_for,
)
from kraft.metadata.controller_logic import ControllerLogic, Outcome, _Batch, error_response
from kraft.metadata.election_config import MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE
from kraft.metadata.image import ConfigKey, MetadataImage
from kraft.metadata.records import ConfigResourceType
from kraft.metadata.topic_rules import validate_topic_name
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

STATIC_BROKER_KEYS: frozenset[str] = frozenset(
    field.alias for field in NodeConfig.model_fields.values() if field.alias
)
"""Every key of a node's .properties (kraft.config): static, so refused with a clear reason."""

TOPIC_TO_BROKER_KEY: Mapping[str, str] = {
    "max.message.bytes": "message.max.bytes",
    "min.insync.replicas": "min.insync.replicas",
}
"""Topic keys whose value, when the topic sets none, comes from the broker's config of this name."""


PER_BROKER_MIN_ISR_REFUSED = (
    "min.insync.replicas cannot be set for one broker: eligible leader replicas (KIP-966, always on) are "
    "safe only if every broker uses the minimum the controller's elections use; set it per topic "
    "(--entity-type topics) or cluster-wide (--entity-type brokers --entity-default)"
)

CLUSTER_MIN_ISR_DELETE_REFUSED = (
    "the cluster-wide min.insync.replicas cannot be removed: every broker and controller reads it instead "
    "of its own .properties (eligible leader replicas, KIP-966, need one minimum); set another value"
)


def _check_resource_count(count: int, what: str) -> None:
    if count > MAX_CONFIG_RESOURCES_PER_REQUEST:
        raise KraftError(
            ErrorCode.POLICY_VIOLATION,
            f"{what} names {count} resources; the limit is {MAX_CONFIG_RESOURCES_PER_REQUEST}",
        )


def _check_resource(image: MetadataImage, resource: cpb.ConfigResource) -> Mapping[str, ConfigSpec]:
    """The specs of the resource's type after checking its name (a topic must exist)."""
    specs = specs_for(resource.resource_type)
    if resource.resource_type == ConfigResourceType.TOPIC:
        validate_topic_name(resource.resource_name)
        if image.topic(resource.resource_name) is None:
            raise KraftError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {resource.resource_name!r} does not exist"
            )
    else:
        check_broker_name(resource.resource_name)
    return specs


def _entry(spec: ConfigSpec, value: str | None, source: str) -> cpb.ConfigEntry:
    entry = cpb.ConfigEntry(
        name=spec.name, source=source, read_only=False, applied=spec.applied, documentation=spec.documentation
    )
    if value is not None:
        entry.value = value
    return entry


def describe_entries(
    image: MetadataImage, resource: cpb.ConfigResource, names: list[str]
) -> list[cpb.ConfigEntry]:
    """Each asked (or every known) config of the resource with its effective value and where it comes from."""
    specs = _check_resource(image, resource)
    if len(names) > MAX_CONFIG_OPS_PER_RESOURCE:
        raise KraftError(
            ErrorCode.POLICY_VIOLATION,
            f"{len(names)} config names for one resource; the limit is {MAX_CONFIG_OPS_PER_RESOURCE}",
        )
    for name in names:
        if name not in specs:
            kind = "topic" if resource.resource_type == ConfigResourceType.TOPIC else "dynamic broker"
            raise KraftError(
                ErrorCode.INVALID_CONFIG,
                f"unknown {kind} config {name[:100]!r} (known: {', '.join(sorted(specs))})",
            )
    wanted = sorted(set(names)) if names else sorted(specs)
    own = image.configs.get(ConfigKey(resource.resource_type, resource.resource_name), {})
    cluster_default = image.configs.get(ConfigKey(ConfigResourceType.BROKER, ""), {})
    entries = []
    for name in wanted:
        spec = specs[name]
        if name in own:
            source = (
                SOURCE_TOPIC
                if resource.resource_type == ConfigResourceType.TOPIC
                else (SOURCE_BROKER if resource.resource_name else SOURCE_DEFAULT_BROKER)
            )
            entries.append(_entry(spec, own[name], source))
            continue
        if resource.resource_type == ConfigResourceType.TOPIC:
            broker_key = TOPIC_TO_BROKER_KEY.get(name)
            if broker_key is None:
                entries.append(_entry(spec, spec.default, SOURCE_DEFAULT))
            elif broker_key in cluster_default:
                entries.append(_entry(spec, cluster_default[broker_key], SOURCE_DEFAULT_BROKER))
            else:
                entries.append(_entry(spec, None, SOURCE_STATIC))  # each broker's .properties
        elif resource.resource_name and name in cluster_default:
            entries.append(_entry(spec, cluster_default[name], SOURCE_DEFAULT_BROKER))
        else:
            entries.append(_entry(spec, None, SOURCE_STATIC))
    return entries


def describe_configs(image: MetadataImage, req: cpb.DescribeConfigsRequest) -> cpb.DescribeConfigsResponse:
    response = cpb.DescribeConfigsResponse()
    try:
        _check_resource_count(len(req.resources), "DescribeConfigs")
    except KraftError as exc:
        return error_response(response, exc.code, exc.message)
    for item in req.resources:
        result = response.results.add()
        result.resource.CopyFrom(item.resource)
        try:
            result.configs.extend(describe_entries(image, item.resource, list(item.config_names)))
        except KraftError as exc:
            error_response(result, exc.code, exc.message)
    return response


def _resource_changes(image: MetadataImage, item: cpb.AlterConfigsResource) -> dict[str, str | None]:
    resource = item.resource
    _check_resource(image, resource)
    current = image.configs.get(ConfigKey(resource.resource_type, resource.resource_name), {})
    ops = [(c.name, c.op, c.value if c.HasField("value") else None) for c in item.configs]
    changes = apply_ops(resource.resource_type, current, ops, STATIC_BROKER_KEYS)
    if (
        resource.resource_type == ConfigResourceType.BROKER
        and resource.resource_name
        and changes.get(MIN_INSYNC_REPLICAS) is not None
    ):
        # Kafka refuses it too once ELR is enabled (ConfigurationControlManager); kraft's ELR is always
        # on.  Deleting a value stored before is allowed (brokers ignore it anyway: replication.py).
        raise KraftError(ErrorCode.INVALID_CONFIG, PER_BROKER_MIN_ISR_REFUSED)
    if (
        resource.resource_type == ConfigResourceType.BROKER
        and not resource.resource_name
        and MIN_INSYNC_REPLICAS in changes
        and changes[MIN_INSYNC_REPLICAS] is None
    ):
        # The active controller wrote it (bootstrap_records); without it each node would fall back to
        # its own .properties, which may differ (Kafka refuses this too).
        raise KraftError(ErrorCode.INVALID_CONFIG, CLUSTER_MIN_ISR_DELETE_REFUSED)
    if resource.resource_type == ConfigResourceType.TOPIC:
        topic = image.topic(resource.resource_name)
        assert topic is not None  # _check_resource
        result = dict(current)
        for name, value in changes.items():
            if value is None:
                result.pop(name, None)
            else:
                result[name] = value
        check_topic_result(result, len(topic.partitions[0].replicas) if topic.partitions else 1)
    # only what really changes is written
    return {name: value for name, value in changes.items() if current.get(name) != value}


def incremental_alter_configs(
    logic: ControllerLogic, req: cpb.IncrementalAlterConfigsRequest, next_offset: int
) -> Outcome[cpb.IncrementalAlterConfigsResponse]:
    response = cpb.IncrementalAlterConfigsResponse()
    try:
        logic.check_cluster_id(req.cluster_id)
        _check_resource_count(len(req.resources), "IncrementalAlterConfigs")
    except KraftError as exc:
        return Outcome([], error_response(response, exc.code, exc.message))
    batch = _Batch(logic, next_offset)
    keys = [(r.resource.resource_type, r.resource.resource_name) for r in req.resources]
    repeats = Counter(keys)
    for item, key in zip(req.resources, keys, strict=True):
        result = response.results.add()
        result.resource.CopyFrom(item.resource)
        try:
            if repeats[key] > 1:
                raise KraftError(
                    ErrorCode.INVALID_REQUEST, "the resource appears more than once in the request"
                )
            changes = _resource_changes(logic.image, item)
        except KraftError as exc:
            error_response(result, exc.code, exc.message)
            continue
        if req.validate_only:
            continue
        for name, value in sorted(changes.items()):
            record = pb.ConfigRecord(
                resource_type=item.resource.resource_type,
                resource_name=item.resource.resource_name,
                name=name,
            )
            if value is not None:
                record.value = value
            batch.add(record)
        if MIN_INSYNC_REPLICAS in changes:
            # A new minimum invalidates the ELRs kept under the old one (KIP-966): cleared in this write.
            if item.resource.resource_type == ConfigResourceType.TOPIC:
                logic.clear_elr(batch, [item.resource.resource_name])
            elif not item.resource.resource_name:  # the cluster-wide default; a broker's own is not used
                logic.clear_elr(batch, None)
        if (changes.get(UNCLEAN_LEADER_ELECTION_ENABLE) or "").strip().lower() == "true":
            # Turned on: offline partitions elect a live replica now, not at the next fence/unfence.
            if item.resource.resource_type == ConfigResourceType.TOPIC:
                logic.elect_leaderless(batch, [item.resource.resource_name])
            else:  # a broker default: any topic without its own value may be concerned
                logic.elect_leaderless(batch, None)
    return Outcome(batch.finish(), response, next_offset)


__all__ = ["BROKER_DYNAMIC_CONFIGS", "describe_configs", "incremental_alter_configs"]
