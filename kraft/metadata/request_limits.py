"""Per-request work limits of the admin RPCs, checked before any work (issue #15).

A 1 MB ElectLeaders request grew a controller to 2.9 GB (each result repeated the topic name), and a
``validate_only`` CreateTopics of 1,000,000 partitions placed every one of them before it was refused.
Each function here looks only at the request's shape — counts, never placements — and costs at most one
pass over the topics it names, which ``max.request.topics`` bounds first.  A request over a limit is
refused as a whole with POLICY_VIOLATION and a message naming the limit and its config key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kraft.errors import ErrorCode, KraftError
from kraft.v1 import controller_pb2 as cpb

MAX_PARTITIONS_PER_TOPIC = 1_000_000
"""Also kraft.metadata.controller_logic's (which imports this module)."""
MAX_EARLIER_INCARNATION_IDS = 64
"""RegisterBroker's ``earlier_incarnation_ids`` at most (a broker sends up to 15:
kraft.broker.incarnation.MAX_PREDECESSORS); more is INVALID_REQUEST."""
MAX_INCARNATION_ID_CHARS = 64
"""An incarnation id's length at most (a broker sends a 36-character UUID); longer is INVALID_REQUEST."""
DEFAULT_MAX_REQUEST_TOPICS = 10_000
DEFAULT_MAX_REQUEST_PARTITIONS = 200_000


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_topics: int = DEFAULT_MAX_REQUEST_TOPICS
    """``max.request.topics``: topics one CreateTopics / DeleteTopics / ElectLeaders names."""
    max_partitions: int = DEFAULT_MAX_REQUEST_PARTITIONS
    """``max.request.partitions``: partitions one CreateTopics creates (or validates) or one ElectLeaders
    names (a topic without a partition list counts as all of its partitions)."""


def _too_many(what: str, count: str, limit: int, key: str) -> KraftError:
    return KraftError(ErrorCode.POLICY_VIOLATION, f"{what} names {count}; the limit is {limit} ({key})")


def _check_topics(what: str, count: int, limits: RequestLimits) -> None:
    if count > limits.max_topics:
        raise _too_many(what, f"{count} topics", limits.max_topics, "max.request.topics")


def check_create_topics(req: cpb.CreateTopicsRequest, limits: RequestLimits, default_partitions: int) -> None:
    """Topics and partitions a CreateTopics asks for (``validate_only`` counts the same)."""
    _check_topics("CreateTopics", len(req.topics), limits)
    total = 0
    for topic in req.topics:
        if topic.assignments:
            total += len(topic.assignments)
        elif topic.num_partitions == -1:
            total += default_partitions
        elif 0 < topic.num_partitions <= MAX_PARTITIONS_PER_TOPIC:
            # (A count outside 1..MAX_PARTITIONS_PER_TOPIC is that topic's INVALID_PARTITIONS, found with
            # no placement work.)
            total += topic.num_partitions
        if total > limits.max_partitions:
            raise _too_many(
                "CreateTopics",
                f"more than {limits.max_partitions} partitions",
                limits.max_partitions,
                "max.request.partitions",
            )


def check_delete_topics(req: cpb.DeleteTopicsRequest, limits: RequestLimits) -> None:
    _check_topics("DeleteTopics", len(req.names), limits)


def check_elect_leaders(
    req: cpb.ElectLeadersRequest, limits: RequestLimits, partitions_of: Callable[[str], int]
) -> None:
    """``partitions_of(topic)``: how many partitions an entry without a partition list stands for."""
    _check_topics("ElectLeaders", len(req.topic_partitions), limits)
    total = 0
    for entry in req.topic_partitions:
        total += len(entry.partitions) or partitions_of(entry.topic)
        if total > limits.max_partitions:
            raise _too_many(
                "ElectLeaders",
                f"more than {limits.max_partitions} partitions",
                limits.max_partitions,
                "max.request.partitions",
            )


def check_register_broker(req: cpb.RegisterBrokerRequest) -> None:
    """The incarnation ids a RegisterBroker names: fixed protocol bounds, not configs, so a request over
    one is malformed (INVALID_REQUEST), not a policy refusal.  The controller compares each earlier id
    with the registered one, so an unbounded list would be unbounded work on the controller."""
    if len(req.earlier_incarnation_ids) > MAX_EARLIER_INCARNATION_IDS:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"RegisterBroker names {len(req.earlier_incarnation_ids)} earlier incarnations; "
            f"the limit is {MAX_EARLIER_INCARNATION_IDS}",
        )
    ids = (req.incarnation_id, req.previous_incarnation_id, *req.earlier_incarnation_ids)
    if any(len(i) > MAX_INCARNATION_ID_CHARS for i in ids):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"RegisterBroker names an incarnation id longer than {MAX_INCARNATION_ID_CHARS} characters",
        )
