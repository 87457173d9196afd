"""The configs kraft keeps in the metadata log (ConfigRecord), what each means, and who applies it (pure).

Two resource types, Kafka's numbers (:class:`kraft.metadata.records.ConfigResourceType`):

* **TOPIC** (resource name: the topic) — every key of :data:`kraft.metadata.topic_rules` may be set at
  creation (``topic create --config``) or later (``config alter``).  Brokers *apply* two of them, read from
  their metadata image on every request: ``max.message.bytes`` (the largest batch a Produce appends) and
  ``min.insync.replicas`` (acks=all needs that many in-sync replicas, and a change clears the partitions'
  eligible leader replicas); ``unclean.leader.election.enable`` is applied by the controller's elections
  and by followers truncating below their high watermark.  The others are validated, stored,
  replicated and shown, but no broker enforces them yet (kraft has no retention, compaction or log roll by
  time) — :attr:`ConfigSpec.applied` says so, and ``config describe`` prints it.
* **BROKER** (resource name: a broker id, or ``""`` for the cluster-wide default of every broker; Kafka's
  ``--entity-default``) — only the *dynamic* keys below may be set, the ones a running broker really
  re-reads: ``message.max.bytes`` and ``min.insync.replicas``.  A per-broker value wins over the cluster
  default, which wins over the broker's ``.properties``; a topic's own value wins over all of them — except
  that ``min.insync.replicas`` is never per broker (refused when written, ignored if stored: the ELR rules
  need every broker to use the controller's minimum, :mod:`kraft.metadata.config_control`).  Every
  other broker key is static (``.properties`` and a restart): refused with INVALID_CONFIG saying so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kraft.errors import ErrorCode, KraftError
from kraft.metadata.records import ConfigResourceType
from kraft.metadata.topic_rules import MAX_INT, TOPIC_CONFIG_RULES, check_min_insync

MAX_CONFIG_RESOURCES_PER_REQUEST = 1_000
"""Resources in one DescribeConfigs / IncrementalAlterConfigs request (POLICY_VIOLATION above)."""
MAX_CONFIG_OPS_PER_RESOURCE = 100
"""Config operations on one resource in one IncrementalAlterConfigs request (more than every known key)."""
MAX_CONFIG_VALUE_BYTES = 4_096
"""A config value's length (every valid value of a known key is far shorter)."""
MAX_CONFIG_NAME_BYTES = 255

SOURCE_TOPIC = "DYNAMIC_TOPIC_CONFIG"
SOURCE_BROKER = "DYNAMIC_BROKER_CONFIG"
SOURCE_DEFAULT_BROKER = "DYNAMIC_DEFAULT_BROKER_CONFIG"
SOURCE_DEFAULT = "DEFAULT_CONFIG"
SOURCE_STATIC = "STATIC_BROKER_CONFIG"


class AlterOp:
    """Kafka's ``AlterConfigOp.OpType`` numbers."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


OP_NAMES = {
    AlterOp.SET: "SET",
    AlterOp.DELETE: "DELETE",
    AlterOp.APPEND: "APPEND",
    AlterOp.SUBTRACT: "SUBTRACT",
}


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    name: str
    check: Callable[[str], bool]
    expected: str
    default: str | None
    """Kafka's default (None: the broker's own setting decides, e.g. its ``.properties``)."""
    applied: bool
    """Brokers enforce it (False: validated, stored and shown only)."""
    is_list: bool
    documentation: str


def _int_range(minimum: int, maximum: int) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        return re.fullmatch(r"[+-]?[0-9]+", value) is not None and minimum <= int(value) <= maximum

    return check


_TOPIC_DEFAULTS: Mapping[str, tuple[str, bool, str]] = {
    "cleanup.policy": ("delete", False, "delete and/or compact (stored; kraft neither deletes nor compacts)"),
    "retention.ms": ("604800000", False, "time to keep a segment (stored; kraft has no retention yet)"),
    "retention.bytes": ("-1", False, "bytes to keep per partition (stored; kraft has no retention yet)"),
    "segment.bytes": ("1073741824", False, "segment size (stored; brokers roll at their log.segment.bytes)"),
    "segment.ms": ("604800000", False, "segment age before a roll (stored; not enforced)"),
    "max.message.bytes": (
        "1048588",
        True,
        "largest record batch a Produce may append (wins over the broker's message.max.bytes)",
    ),
    "min.insync.replicas": ("1", True, "in-sync replicas an acks=all Produce needs (NOT_ENOUGH_REPLICAS)"),
    "compression.type": ("producer", False, "stored; brokers keep batches as produced"),
    "unclean.leader.election.enable": (
        "false",
        True,
        "true: a partition with no live ISR or eligible (ELR) replica elects any live replica — records "
        "acknowledged by the lost ones may be gone (the controller applies it)",
    ),
    "delete.retention.ms": ("86400000", False, "tombstone retention when compacting (stored only)"),
    "min.compaction.lag.ms": ("0", False, "stored only"),
    "message.timestamp.type": ("CreateTime", False, "stored; brokers keep the producer's timestamps"),
}

TOPIC_CONFIGS: Mapping[str, ConfigSpec] = {
    name: ConfigSpec(
        name,
        check,
        expected,
        _TOPIC_DEFAULTS[name][0],
        _TOPIC_DEFAULTS[name][1],
        name == "cleanup.policy",
        _TOPIC_DEFAULTS[name][2],
    )
    for name, (check, expected) in TOPIC_CONFIG_RULES.items()
}

BROKER_DYNAMIC_CONFIGS: Mapping[str, ConfigSpec] = {
    "message.max.bytes": ConfigSpec(
        "message.max.bytes",
        _int_range(0, MAX_INT),
        f"an integer in 0..{MAX_INT}",
        None,
        True,
        False,
        "largest record batch a Produce may append to a topic without max.message.bytes (capped by "
        "grpc.max.message.bytes)",
    ),
    "min.insync.replicas": ConfigSpec(
        "min.insync.replicas",
        _int_range(1, MAX_INT),
        f"an integer in 1..{MAX_INT}",
        None,
        True,
        False,
        "in-sync replicas an acks=all Produce needs on a topic without its own min.insync.replicas "
        "(cluster-wide default only: a per-broker value is refused)",
    ),
    "unclean.leader.election.enable": ConfigSpec(
        "unclean.leader.election.enable",
        lambda value: value.strip().lower() in ("true", "false"),
        "true or false",
        None,
        True,
        False,
        "the cluster-wide default (--entity-default) for topics without their own value: true lets the "
        "controller elect a replica outside the ISR and ELR when none of those is live (data loss)",
    ),
}


def specs_for(resource_type: int) -> Mapping[str, ConfigSpec]:
    if resource_type == ConfigResourceType.TOPIC:
        return TOPIC_CONFIGS
    if resource_type == ConfigResourceType.BROKER:
        return BROKER_DYNAMIC_CONFIGS
    raise KraftError(
        ErrorCode.INVALID_REQUEST, f"unknown config resource type {resource_type} (2 = TOPIC, 4 = BROKER)"
    )


def check_broker_name(name: str) -> None:
    """A BROKER resource names a broker id (0..2^31-1) or is ``""`` (the cluster-wide default)."""
    if name and (re.fullmatch(r"[0-9]{1,10}", name) is None or int(name) > MAX_INT):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"broker config resource {name[:64]!r} is not a broker id (or '' for the cluster-wide default)",
        )


def _list_items(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def apply_ops(
    resource_type: int,
    current: Mapping[str, str],
    ops: list[tuple[str, int, str | None]],
    static_keys: frozenset[str] = frozenset(),
) -> dict[str, str | None]:
    """The changes ``ops`` (name, op, value) make to ``current``: name → new value, or None to delete.

    Every op is checked before any change is returned (an op on a resource fails the whole resource, as in
    Kafka): unknown op, name given twice, unknown key (or a static broker key: ``static_keys``), value
    missing, too long or invalid for its key, APPEND/SUBTRACT on a key that is not a list.
    """
    specs = specs_for(resource_type)
    if len(ops) > MAX_CONFIG_OPS_PER_RESOURCE:
        raise KraftError(
            ErrorCode.POLICY_VIOLATION,
            f"{len(ops)} config operations on one resource; the limit is {MAX_CONFIG_OPS_PER_RESOURCE}",
        )
    seen: set[str] = set()
    changes: dict[str, str | None] = {}
    for name, op, value in ops:
        if len(name.encode()) > MAX_CONFIG_NAME_BYTES:
            raise KraftError(
                ErrorCode.INVALID_CONFIG, f"config name of {len(name.encode())} bytes is too long"
            )
        if name in seen:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"config {name!r} appears more than once")
        seen.add(name)
        if op not in OP_NAMES:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"unknown config operation {op} for {name!r}")
        spec = specs.get(name)
        if spec is None:
            if resource_type == ConfigResourceType.BROKER and name in static_keys:
                raise KraftError(
                    ErrorCode.INVALID_CONFIG,
                    f"broker config {name!r} is not dynamic: set it in the broker's .properties and restart "
                    f"(dynamic: {', '.join(sorted(specs))})",
                )
            kind = "topic" if resource_type == ConfigResourceType.TOPIC else "dynamic broker"
            raise KraftError(
                ErrorCode.INVALID_CONFIG,
                f"unknown {kind} config {name!r} (known: {', '.join(sorted(specs))})",
            )
        if op == AlterOp.DELETE:
            changes[name] = None
            continue
        if value is None:
            raise KraftError(ErrorCode.INVALID_CONFIG, f"{OP_NAMES[op]} of {name} needs a value")
        if len(value.encode()) > MAX_CONFIG_VALUE_BYTES:
            raise KraftError(
                ErrorCode.INVALID_CONFIG,
                f"value for {name} is {len(value.encode())} bytes; the limit is {MAX_CONFIG_VALUE_BYTES}",
            )
        if op in (AlterOp.APPEND, AlterOp.SUBTRACT):
            if not spec.is_list:
                raise KraftError(
                    ErrorCode.INVALID_CONFIG, f"{OP_NAMES[op]} needs a list config; {name} is not one"
                )
            base = current.get(name, spec.default or "")
            items = _list_items(base)
            if op == AlterOp.APPEND:
                items += [item for item in _list_items(value) if item not in items]
            else:
                removed = set(_list_items(value))
                items = [item for item in items if item not in removed]
            if not items:
                changes[name] = None  # an emptied list is the default again (Kafka deletes it too)
                continue
            new_value = ",".join(items)
        else:
            new_value = value
        if not spec.check(new_value):
            raise KraftError(
                ErrorCode.INVALID_CONFIG,
                f"invalid value {new_value[:100]!r} for {name}: expected {spec.expected}",
            )
        changes[name] = new_value
    return changes


def check_topic_result(configs: Mapping[str, str], replication_factor: int) -> None:
    """Cross-key rules on a topic's configs after a change (min.insync.replicas ≤ replication factor)."""
    check_min_insync(configs.get("min.insync.replicas"), replication_factor)
