"""Replica agreement: committed log bytes and applied-image hashes must match across nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chaos.checkers.verdict import Verdict, failed, passed, unknown


@dataclass(frozen=True, slots=True)
class NodeLog:
    """What one node's metadata log holds: record bytes by offset, and its high watermark.

    ``log_start_offset`` is where the node's log begins (earlier offsets were folded into a snapshot);
    offsets below it are not compared for that node.
    """

    node_id: int
    high_watermark: int
    records: Mapping[int, bytes]
    log_start_offset: int = 0


def check_committed_logs_identical(logs: Sequence[NodeLog]) -> Verdict:
    """All nodes agree byte for byte on every offset below the lowest high watermark."""
    checker = "committed-logs-identical"
    if len(logs) < 2:
        return unknown(checker, f"need at least two logs, got {len(logs)}")
    lowest_hwm = min(log.high_watermark for log in logs)
    start = max(log.log_start_offset for log in logs)
    problems: list[str] = []
    for offset in range(start, lowest_hwm):
        variants: dict[bytes, list[int]] = defaultdict(list)
        for log in logs:
            data = log.records.get(offset)
            if data is None:
                problems.append(f"offset {offset}: missing on node {log.node_id} (below its committed range)")
                continue
            variants[data].append(log.node_id)
        if len(variants) > 1:
            groups = "; ".join(
                f"nodes {sorted(nodes)} hold {len(data)} bytes {data[:8].hex()}…"
                for data, nodes in variants.items()
            )
            problems.append(f"offset {offset}: divergent records: {groups}")
    compared = max(lowest_hwm - start, 0)
    if compared == 0 and not problems:
        return unknown(checker, f"nothing committed to compare (lowest HWM {lowest_hwm}, log start {start})")
    if problems:
        return failed(
            checker,
            f"{len(problems)} offsets disagree below HWM {lowest_hwm}",
            problems,
            lowest_high_watermark=lowest_hwm,
            compared_offsets=compared,
        )
    return passed(
        checker,
        f"{len(logs)} logs identical over offsets [{start}, {lowest_hwm})",
        lowest_high_watermark=lowest_hwm,
        compared_offsets=compared,
    )


@dataclass(frozen=True, slots=True)
class ImageHashes:
    """Hashes of a node's applied metadata image, by the log offset the image was taken at."""

    node: str  # "controller-1", "broker-101"
    is_broker: bool
    by_offset: Mapping[int, str] = field(default_factory=dict)


def check_images_match(images: Sequence[ImageHashes]) -> Verdict:
    """At each offset, every broker's image hash equals the controllers' (and controllers agree)."""
    checker = "broker-image-equals-controller"
    reference: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for image in images:
        if not image.is_broker:
            for offset, digest in image.by_offset.items():
                reference[offset][digest].append(image.node)
    problems: list[str] = []
    compared = 0
    for offset, digests in sorted(reference.items()):
        if len(digests) > 1:
            problems.append(f"offset {offset}: controllers disagree: {dict(digests)}")
    for image in images:
        if not image.is_broker:
            continue
        for offset, digest in sorted(image.by_offset.items()):
            expected = reference.get(offset)
            if not expected:
                continue
            compared += 1
            if digest not in expected:
                problems.append(
                    f"{image.node} at offset {offset}: image {digest} != controller {sorted(expected)}"
                )
    if problems:
        return failed(checker, f"{len(problems)} image mismatches", problems, compared=compared)
    if compared == 0:
        broker_offsets = sum(len(i.by_offset) for i in images if i.is_broker)
        return unknown(
            checker,
            "no broker image shares an offset with a controller image",
            broker_offsets=broker_offsets,
            controller_offsets=len(reference),
        )
    return passed(checker, f"{compared} broker images match the controllers'", compared=compared)
