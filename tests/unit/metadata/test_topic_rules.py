"""Topic-name collisions ('.' and '_' are equivalent, as in Kafka): the enumeration used by CreateTopics
agrees with keying every name, and CreateTopics refuses a colliding name with the clashing one named."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.metadata.topic_rules import MAX_SEPARATOR_VARIANTS_BITS, colliding_name, collision_key
from kraft.v1 import controller_pb2 as cpb

_names = st.text(alphabet="ab._", min_size=1, max_size=MAX_SEPARATOR_VARIANTS_BITS + 4)


def _by_keys(name: str, existing: set[str]) -> set[str]:
    return {other for other in existing if other != name and collision_key(other) == collision_key(name)}


@settings(max_examples=500, deadline=None)
@given(name=_names, existing=st.sets(_names, max_size=12), twin=st.booleans())
def test_colliding_name_finds_exactly_what_keying_every_name_finds(
    name: str, existing: set[str], twin: bool
) -> None:
    if twin:  # make a collision likely: another spelling of the same name
        existing.add(name.replace(".", "#").replace("_", ".").replace("#", "_"))
    found = colliding_name(name, existing)
    expected = _by_keys(name, existing)
    if expected:
        assert found in expected
    else:
        assert found is None


def test_long_names_fall_back_to_a_scan() -> None:
    name = "a." * (MAX_SEPARATOR_VARIANTS_BITS + 3)
    other = name.replace(".", "_")
    assert colliding_name(name, {other, "b"}) == other
    assert colliding_name(name, {name, "b"}) is None


def _logic_with_a_broker() -> ControllerLogic:
    ids = (f"topic-{i}" for i in itertools.count())
    logic = ControllerLogic(
        ControllerSettings("c1", max_changes_per_write=1000),
        MetadataImage.empty(),
        0,
        new_topic_id=lambda: next(ids),
    )
    registered = logic.register_broker(
        cpb.RegisterBrokerRequest(cluster_id="c1", broker_id=1, incarnation_id="i"), 0, 0
    )
    beat = cpb.BrokerHeartbeatRequest(
        cluster_id="c1", broker_id=1, broker_epoch=logic.image.brokers[1].epoch, current_metadata_offset=99
    )
    logic.broker_heartbeat(beat, 0, len(registered.records))
    return logic


def _create(logic: ControllerLogic, *names: str) -> list[cpb.CreatableTopicResult]:
    topics = [cpb.CreatableTopic(name=n, num_partitions=1, replication_factor=1) for n in names]
    return list(
        logic.create_topics(cpb.CreateTopicsRequest(cluster_id="c1", topics=topics), 10).response.topics
    )


def test_create_topics_refuses_a_name_colliding_with_an_existing_or_earlier_one() -> None:
    logic = _logic_with_a_broker()
    (first,) = _create(logic, "orders.eu")
    assert first.error_code == ErrorCode.NONE
    clash, fresh, same_request = _create(logic, "orders_eu", "orders-eu", "pay.x")
    assert clash.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "'orders.eu'" in clash.error_message
    assert fresh.error_code == ErrorCode.NONE and same_request.error_code == ErrorCode.NONE
    ok, later = _create(logic, "a.b", "a_b")
    assert ok.error_code == ErrorCode.NONE
    assert later.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION and "'a.b'" in later.error_message
