"""Kafka's topic-name rules, the topic configs kraft accepts, and the partition limits (pure validation)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

from kraft.errors import ErrorCode, KraftError
from kraft.storage.fileio import MAX_FILE_NAME_BYTES

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_topic_name(name: str) -> None:
    """Kafka's ``Topic.validate``: 1 to 249 chars of [a-zA-Z0-9._-], and not ``.`` or ``..``."""
    if not name:
        raise KraftError(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty")
    if name in (".", ".."):
        raise KraftError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise KraftError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name is {len(name)} characters long, the limit is {MAX_TOPIC_NAME_LENGTH}",
        )
    if not _LEGAL.match(name):
        raise KraftError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' are allowed",
        )


def check_partition_dir_names(name: str, partitions: int) -> None:
    """Refuse a partition count whose last partition's directory ``<name>-<partitions - 1>`` would not fit
    a file name: brokers could never create it (Kafka leaves this to fail on the broker)."""
    longest = len(name.encode()) + 1 + len(str(max(partitions - 1, 0)))
    if longest > MAX_FILE_NAME_BYTES:
        room = MAX_FILE_NAME_BYTES - len(name.encode()) - 1
        raise KraftError(
            ErrorCode.INVALID_PARTITIONS,
            f"{partitions} partitions: a {len(name)}-character topic name leaves room for partition ids of "
            f"{room} digit(s) in a {MAX_FILE_NAME_BYTES}-byte directory name (at most {10**room} partitions)",
        )


def check_partition_limits(
    name: str,
    partitions: int,
    cluster_partitions: int,
    max_partitions: int,
    added_by_broker: Mapping[int, int],
    broker_partitions: Callable[[int], int],
    max_broker_partitions: int,
    reserved_partitions: int = 0,
    broker_reserved: Callable[[int], int] | None = None,
    broker_left_out: Callable[[int], int] | None = None,
) -> None:
    """``max.partitions`` (partitions in the cluster) and ``max.broker.partitions`` (replicas on one broker):
    refuse a topic that would take the cluster or any broker past its limit (POLICY_VIOLATION, naming the
    limit and the request).  ``cluster_partitions`` and ``broker_partitions`` include what this request
    already created; ``added_by_broker`` is this topic's replicas per broker.  ``reserved_partitions`` and
    ``broker_reserved`` are what topics still being created will add (counted as if they existed:
    :mod:`kraft.metadata.partition_reservations`), less ``broker_left_out`` — asked only for a broker that
    the full reserved count would refuse (what later plans hold is never negative, so any other broker
    passes either way; summing it for every broker cost O(later plans x brokers) per check)."""
    if cluster_partitions + reserved_partitions + partitions > max_partitions:
        reserved = (
            f" (+{reserved_partitions} reserved by topics being created)" if reserved_partitions else ""
        )
        raise KraftError(
            ErrorCode.POLICY_VIOLATION,
            f"topic {name!r} would add {partitions} partitions to the cluster's "
            f"{cluster_partitions + reserved_partitions}{reserved}, above max.partitions={max_partitions}",
        )
    for broker_id in sorted(added_by_broker):
        hosted = broker_partitions(broker_id)
        held = broker_reserved(broker_id) if broker_reserved is not None else 0
        if broker_left_out is not None and hosted + held + added_by_broker[broker_id] > max_broker_partitions:
            held -= broker_left_out(broker_id)
        if hosted + held + added_by_broker[broker_id] > max_broker_partitions:
            reserved = f" (+{held} reserved by topics being created)" if held else ""
            raise KraftError(
                ErrorCode.POLICY_VIOLATION,
                f"topic {name!r} would add {added_by_broker[broker_id]} partition replicas to broker "
                f"{broker_id}, which hosts {hosted + held}{reserved}, above "
                f"max.broker.partitions={max_broker_partitions}",
            )


def collision_key(name: str) -> str:
    """Names equal up to '.' vs '_' collide in Kafka's metric names, so Kafka refuses the second one."""
    return name.replace(".", "_")


MAX_SEPARATOR_VARIANTS_BITS = 10
"""Above this many '.'/'_' in a name, :func:`colliding_name` scans every name instead of enumerating."""


def colliding_name(name: str, existing: Collection[str]) -> str | None:
    """A name in ``existing``, other than ``name`` itself, that collides with ``name`` (equal up to '.' vs
    '_'), or None.

    Enumerates the 2^k spellings of ``name`` (k = its '.'/'_' count) instead of keying every existing name:
    a CreateTopics request must not cost O(topics in the cluster) (it did: 8 % of an active controller's
    CPU with thousands of topics).
    """
    positions = [i for i, char in enumerate(name) if char in "._"]
    if not positions:
        return None
    if len(positions) > MAX_SEPARATOR_VARIANTS_BITS:
        key = collision_key(name)
        return next((other for other in existing if other != name and collision_key(other) == key), None)
    chars = list(name)
    for mask in range(1 << len(positions)):
        for bit, position in enumerate(positions):
            chars[position] = "_" if mask >> bit & 1 else "."
        spelling = "".join(chars)
        if spelling != name and spelling in existing:
            return spelling
    return None


MAX_INT = 2**31 - 1
MAX_LONG = 2**63 - 1


def _long(minimum: int, maximum: int = MAX_LONG) -> Callable[[str], bool]:
    """Kafka's INT/LONG config types: bounded, so a stored value always means what it says."""

    def check(value: str) -> bool:
        # Java's Long.parseLong: an optional sign and digits only (Python's int() also takes "1_000").
        return re.fullmatch(r"[+-]?[0-9]+", value) is not None and minimum <= int(value) <= maximum

    return check


def _bool_text(value: str) -> bool:
    return value.strip().lower() in ("true", "false")  # Kafka's ConfigDef BOOLEAN: case-insensitive


def _one_of(*choices: str) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        return all(part.strip() in choices for part in value.split(",")) and bool(value)

    return check


TOPIC_CONFIG_RULES: Mapping[str, tuple[Callable[[str], bool], str]] = {
    "cleanup.policy": (_one_of("delete", "compact"), "delete and/or compact"),
    "retention.ms": (_long(-1), "an integer ≥ -1"),
    "retention.bytes": (_long(-1), "an integer ≥ -1"),
    "segment.bytes": (_long(14, MAX_INT), f"an integer in 14..{MAX_INT}"),
    "segment.ms": (_long(1), "an integer ≥ 1"),
    "max.message.bytes": (_long(0, MAX_INT), f"an integer in 0..{MAX_INT}"),
    "min.insync.replicas": (_long(1, MAX_INT), f"an integer in 1..{MAX_INT}"),
    "compression.type": (
        _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        "uncompressed, zstd, lz4, snappy, gzip or producer",
    ),
    # true: a partition with no live ISR or ELR member elects any live replica (data loss; KIP-704 recovery)
    "unclean.leader.election.enable": (_bool_text, "true or false"),
    "delete.retention.ms": (_long(0), "an integer ≥ 0"),
    "min.compaction.lag.ms": (_long(0), "an integer ≥ 0"),
    "message.timestamp.type": (_one_of("CreateTime", "LogAppendTime"), "CreateTime or LogAppendTime"),
}


def validate_topic_configs(configs: list[tuple[str, str]], replication_factor: int) -> dict[str, str]:
    result: dict[str, str] = {}
    for name, value in configs:
        rule = TOPIC_CONFIG_RULES.get(name)
        if rule is None:
            raise KraftError(ErrorCode.INVALID_CONFIG, f"unknown topic config {name!r}")
        if name in result:
            raise KraftError(ErrorCode.INVALID_CONFIG, f"topic config {name!r} is given twice")
        check, expected = rule
        if not check(value):
            raise KraftError(
                ErrorCode.INVALID_CONFIG, f"invalid value {value!r} for {name}: expected {expected}"
            )
        result[name] = value
    check_min_insync(result.get("min.insync.replicas"), replication_factor)
    return result


def check_min_insync(min_isr: str | None, replication_factor: int) -> None:
    """A topic's min.insync.replicas may not exceed its replication factor (acks=all could never succeed)."""
    if min_isr is not None and int(min_isr) > replication_factor:
        raise KraftError(
            ErrorCode.INVALID_CONFIG,
            f"min.insync.replicas {min_isr} is larger than the replication factor {replication_factor}",
        )
