"""Set, replication, leadership, fencing and liveness checkers on hand-made data."""

from __future__ import annotations

from chaos_histories import op

from chaos.checkers import (
    ClusterSample,
    FencingInterval,
    ImageHashes,
    LeaderObservation,
    NodeLog,
    Status,
    TopicObservation,
    check_committed_logs_identical,
    check_fenced_broker_never_acked,
    check_images_match,
    check_liveness_after_heal,
    check_no_failed_visible,
    check_no_lost_acknowledged,
    check_single_leader_per_epoch,
)
from chaos.history import EventType

FAIL = EventType.FAIL


def _final(*topics: str, at: int = 1000) -> TopicObservation:
    return TopicObservation("controller", at, frozenset(topics))


# --- no acknowledged operation lost ---


def test_acknowledged_create_missing_at_the_end_is_lost() -> None:
    lost = op("create", 0, 1, key="a", result="created")
    kept = op("create", 0, 1, key="b", result="created")
    verdict = check_no_lost_acknowledged([lost, kept], _final("b"))
    assert verdict.status is Status.FAIL
    assert verdict.offending == (f"{lost.describe()}: topic missing in controller at the end",)


def test_create_undone_by_a_later_or_uncertain_delete_is_not_lost() -> None:
    create = op("create", 0, 1, key="a", result="created")
    uncertain_delete = op("delete", 5, None, key="a")
    assert check_no_lost_acknowledged([create, uncertain_delete], _final()).ok
    failed_delete = op("delete", 5, 6, key="a", outcome=FAIL)
    assert not check_no_lost_acknowledged([create, failed_delete], _final()).ok


def test_acknowledged_delete_must_not_come_back() -> None:
    ops = [op("create", 0, 1, key="a", result="created"), op("delete", 2, 3, key="a", result="deleted")]
    assert not check_no_lost_acknowledged(ops, _final("a")).ok
    assert check_no_lost_acknowledged(ops, _final()).ok


# --- no failed operation visible ---


def test_failed_create_must_never_be_visible() -> None:
    failed_create = op("create", 0, 1, key="a", outcome=FAIL)
    seen = [TopicObservation("broker-101", 5, frozenset({"a"}))]
    verdict = check_no_failed_visible([failed_create], seen)
    assert verdict.status is Status.FAIL and failed_create.describe() in verdict.offending[0]
    retried = op("create", 2, None, key="a")
    assert check_no_failed_visible([failed_create, retried], seen).ok


def test_failed_delete_must_never_hide_the_topic() -> None:
    create = op("create", 0, 1, key="a", result="created")
    failed_delete = op("delete", 2, 3, key="a", outcome=FAIL)
    gone = [TopicObservation("controller", 10, frozenset())]
    assert not check_no_failed_visible([create, failed_delete], gone).ok
    there = [TopicObservation("controller", 10, frozenset({"a"}))]
    assert check_no_failed_visible([create, failed_delete], there).ok


# --- committed logs identical ---


def test_identical_logs_below_the_lowest_hwm_pass_and_uncommitted_tails_may_differ() -> None:
    common = {0: b"a", 1: b"b", 2: b"c"}
    logs = [NodeLog(1, 3, {**common, 3: b"x"}), NodeLog(2, 3, {**common, 3: b"y"}), NodeLog(3, 2, common)]
    verdict = check_committed_logs_identical(logs)
    assert verdict.ok and verdict.details["compared_offsets"] == 2


def test_divergent_or_missing_committed_records_fail() -> None:
    logs = [
        NodeLog(1, 3, {0: b"a", 1: b"b", 2: b"c"}),
        NodeLog(2, 3, {0: b"a", 1: b"B", 2: b"c"}),
        NodeLog(3, 3, {0: b"a", 2: b"c"}),
    ]
    verdict = check_committed_logs_identical(logs)
    assert verdict.status is Status.FAIL
    assert any("missing on node 3" in line for line in verdict.offending)
    assert any("offset 1: divergent" in line for line in verdict.offending)


def test_snapshotted_prefix_is_not_compared() -> None:
    logs = [
        NodeLog(1, 4, {2: b"c", 3: b"d"}, log_start_offset=2),
        NodeLog(2, 4, {0: b"a", 1: b"b", 2: b"c", 3: b"d"}),
    ]
    assert check_committed_logs_identical(logs).ok


# --- images ---


def test_broker_image_must_equal_the_controllers_at_the_same_offset() -> None:
    controllers = [
        ImageHashes("controller-1", False, {10: "h10", 20: "h20"}),
        ImageHashes("controller-2", False, {10: "h10"}),
    ]
    good = ImageHashes("broker-101", True, {10: "h10", 15: "unmatched-offset"})
    bad = ImageHashes("broker-102", True, {20: "other"})
    assert check_images_match([*controllers, good]).ok
    verdict = check_images_match([*controllers, good, bad])
    assert verdict.status is Status.FAIL and verdict.offending[0].startswith("broker-102 at offset 20")
    assert check_images_match([ImageHashes("broker-1", True, {1: "x"})]).status is Status.UNKNOWN


# --- leadership ---


def test_two_leaders_in_one_epoch_fail() -> None:
    observations = [
        LeaderObservation("1", 3, 1, 10),
        LeaderObservation("2", 3, 2, 11),
        LeaderObservation("3", 4, 2, 12),
    ]
    verdict = check_single_leader_per_epoch(observations)
    assert verdict.status is Status.FAIL and verdict.offending[0].startswith("epoch 3:")


def test_epochs_going_backwards_fail_and_a_clean_run_passes() -> None:
    clean = [
        LeaderObservation("1", 1, 1, 1),
        LeaderObservation("1", 2, None, 2),
        LeaderObservation("1", 2, 3, 3),
    ]
    assert check_single_leader_per_epoch(clean).ok
    backwards = [*clean, LeaderObservation("1", 1, 1, 4)]
    verdict = check_single_leader_per_epoch(backwards)
    assert verdict.status is Status.FAIL and "epoch went back from 2" in verdict.offending[0]


def test_a_wiped_disk_starts_its_epochs_again_but_one_disk_never_goes_back() -> None:
    # controller-1 saw epoch 2, then its disk was wiped: the new directory id knows no epoch yet (KIP-853)
    before_wipe = [LeaderObservation("1", 1, 1, 1, "disk-a"), LeaderObservation("1", 2, 3, 2, "disk-a")]
    after_wipe = [LeaderObservation("1", 0, None, 3, "disk-b"), LeaderObservation("1", 2, 3, 4, "disk-b")]
    assert check_single_leader_per_epoch([*before_wipe, *after_wipe]).ok
    back_on_the_new_disk = LeaderObservation("1", 1, 1, 5, "disk-b")
    verdict = check_single_leader_per_epoch([*before_wipe, *after_wipe, back_on_the_new_disk])
    assert verdict.status is Status.FAIL
    assert verdict.offending == ("1 (disk disk-b): epoch went back from 2 (t=4) to 1 (t=5)",)
    # the same disk losing its epoch (a quorum-state lost on restart) is still caught
    lost_state = LeaderObservation("1", 0, None, 3, "disk-a")
    verdict = check_single_leader_per_epoch([*before_wipe, lost_state])
    assert verdict.status is Status.FAIL and "epoch went back from 2" in verdict.offending[0]


# --- fencing ---


def test_produce_acknowledged_by_a_fenced_broker_fails() -> None:
    before = op("produce", 0, 5, process=1, key="t-0")
    in_flight = op("produce", 9, 12, process=1, key="t-0")  # invoked before the fence committed
    after = op("produce", 15, 16, process=1, key="t-0")
    other_broker = op("produce", 15, 16, process=2, key="t-0")
    fencing = [FencingInterval(broker_id=101, fenced_ns=10, unfenced_ns=None)]
    brokers = {1: 101, 2: 102}
    verdict = check_fenced_broker_never_acked([before, in_flight, other_broker], fencing, brokers)
    assert verdict.ok
    verdict = check_fenced_broker_never_acked([before, after], fencing, brokers)
    assert verdict.status is Status.FAIL and verdict.offending[0].startswith(after.describe())
    unfenced = [FencingInterval(101, 10, 14)]
    assert check_fenced_broker_never_acked([after], unfenced, brokers).ok


# --- liveness ---


def test_liveness_needs_a_leader_and_every_live_broker_unfenced_within_the_bound() -> None:
    second = 1_000_000_000
    samples = [
        ClusterSample(1 * second, None, {101: True}),
        ClusterSample(3 * second, 2, {101: True, 102: False}),
        ClusterSample(4 * second, 2, {101: False, 102: False}),
    ]
    verdict = check_liveness_after_heal(samples, healed_ns=0, live_brokers=[101, 102], bound_s=5)
    assert verdict.ok and verdict.details["recovery_s"] == 4.0
    late = check_liveness_after_heal(samples, healed_ns=0, live_brokers=[101, 102], bound_s=3.5)
    assert late.status is Status.FAIL and late.offending == ("broker 101 still fenced",)
    assert check_liveness_after_heal([], 0, [101], 5).status is Status.UNKNOWN
