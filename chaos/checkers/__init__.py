"""Checkers: pure functions over histories and collected cluster data, each returning a :class:`Verdict`."""

from chaos.checkers.leadership import (
    ClusterSample,
    FencingInterval,
    LeaderObservation,
    check_fenced_broker_never_acked,
    check_liveness_after_heal,
    check_single_leader_per_epoch,
)
from chaos.checkers.linearizability import (
    KeyResult,
    Model,
    RegisterModel,
    TopicModel,
    check_key,
    check_linearizable,
)
from chaos.checkers.replication import (
    ImageHashes,
    NodeLog,
    check_committed_logs_identical,
    check_images_match,
)
from chaos.checkers.topics import TopicObservation, check_no_failed_visible, check_no_lost_acknowledged
from chaos.checkers.verdict import Status, Verdict

__all__ = [
    "ClusterSample",
    "FencingInterval",
    "ImageHashes",
    "KeyResult",
    "LeaderObservation",
    "Model",
    "NodeLog",
    "RegisterModel",
    "Status",
    "TopicModel",
    "TopicObservation",
    "Verdict",
    "check_committed_logs_identical",
    "check_fenced_broker_never_acked",
    "check_images_match",
    "check_key",
    "check_linearizable",
    "check_liveness_after_heal",
    "check_no_failed_visible",
    "check_no_lost_acknowledged",
    "check_single_leader_per_epoch",
]
