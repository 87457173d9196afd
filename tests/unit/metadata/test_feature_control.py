"""Feature levels on the controller: the bootstrap records of a new cluster, UpdateFeatures (upgrade, safe
downgrade, refusals) and the registration of a broker that proves its previous incarnation is gone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from kraft.errors import ErrorCode
from kraft.features import SUPPORTED_FEATURES, MetadataVersion
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.feature_control import SAFE_DOWNGRADE, UNSAFE_DOWNGRADE, UPGRADE, update_features
from kraft.metadata.image import MetadataImage
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

CLUSTER = "cluster-A"
MV = "metadata.version"
# A wider table than this build's (one level), so that upgrades and downgrades between levels can be
# exercised: level 3 changed the metadata, level 2 did not.
VERSIONS = (
    MetadataVersion(1, "0.1-IV0", changed_metadata=True),
    MetadataVersion(2, "0.2-IV0", changed_metadata=False),
    MetadataVersion(3, "0.3-IV0", changed_metadata=True),
)


class Logic:
    """ControllerLogic plus its log; every outcome's records are committed at once."""

    def __init__(self, bootstrap: Mapping[str, int], supported: Mapping[str, tuple[int, int]]) -> None:
        self.now_ms = 1_000
        self.logic = ControllerLogic(
            ControllerSettings(
                CLUSTER,
                bootstrap_features=dict(bootstrap),
                supported_features=dict(supported),
                metadata_versions=VERSIONS,
            ),
            MetadataImage.empty(),
            self.now_ms,
        )
        self.log: list[pb.MetadataRecord] = []
        self.log.extend(self.logic.bootstrap_records(0))

    def update(
        self, *updates: tuple[str, int, int], validate_only: bool = False
    ) -> tuple[cpb.UpdateFeaturesResponse, list[pb.MetadataRecord]]:
        req = cpb.UpdateFeaturesRequest(
            cluster_id=CLUSTER,
            updates=[
                cpb.FeatureUpdate(feature=f, max_version_level=v, upgrade_type=t) for f, v, t in updates
            ],
            validate_only=validate_only,
        )
        out = update_features(self.logic, req, len(self.log))
        self.log.extend(out.records)
        return out.response, list(out.records)

    def register(
        self, broker_id: int, incarnation: str, previous: str = "", features: Sequence[pb.BrokerFeature] = ()
    ) -> cpb.RegisterBrokerResponse:
        req = cpb.RegisterBrokerRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            incarnation_id=incarnation,
            listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
            log_dirs=["/data"],
            previous_incarnation_id=previous,
            features=list(features),
        )
        out = self.logic.register_broker(req, self.now_ms, len(self.log))
        self.log.extend(out.records)
        return out.response

    def unfence(self, broker_id: int) -> None:
        broker = self.logic.image.brokers[broker_id]
        req = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=broker.epoch,
            current_metadata_offset=len(self.log) - 1,
        )
        out = self.logic.broker_heartbeat(req, self.now_ms, len(self.log))
        self.log.extend(out.records)
        assert not out.response.is_fenced


def _levels(records: Sequence[pb.MetadataRecord]) -> list[tuple[str, int]]:
    return [
        (r.feature_level.name, r.feature_level.feature_level) for r in records if r.HasField("feature_level")
    ]


@pytest.fixture
def wide() -> Logic:
    return Logic({MV: 1}, {MV: (1, 3)})


def test_a_new_cluster_starts_at_the_bootstrap_level_and_bootstraps_once() -> None:
    logic = Logic({MV: 2, "zeta.version": 1}, {MV: (1, 3)})
    assert _levels(logic.log) == [(MV, 2), ("zeta.version", 1)]  # metadata.version first
    assert logic.logic.image.features[MV] == 2
    assert logic.logic.bootstrap_records(len(logic.log)) == []


def test_without_a_bootstrap_checkpoint_the_latest_supported_level_is_written() -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    assert _levels(logic.bootstrap_records(0)) == [(MV, SUPPORTED_FEATURES[MV][1])]


def test_upgrade_writes_one_record_and_the_same_level_again_writes_nothing(wide: Logic) -> None:
    response, records = wide.update((MV, 3, UPGRADE))
    assert [r.error_code for r in response.results] == [ErrorCode.NONE]
    assert _levels(records) == [(MV, 3)]
    assert wide.logic.image.features[MV] == 3
    again, records = wide.update((MV, 3, UPGRADE))
    assert (again.results[0].error_code, records) == (ErrorCode.NONE, [])


def test_validate_only_checks_and_writes_nothing(wide: Logic) -> None:
    response, records = wide.update((MV, 2, UPGRADE), validate_only=True)
    assert (response.results[0].error_code, records) == (ErrorCode.NONE, [])
    assert wide.logic.image.features[MV] == 1


@pytest.mark.parametrize(
    ("update", "fragment"),
    [
        ((MV, 4, UPGRADE), "level 4 is not supported by this controller (1..3)"),
        ((MV, 0, SAFE_DOWNGRADE), "level 0 is not supported by this controller (1..3)"),
        (("nosuch.version", 1, UPGRADE), "unknown feature 'nosuch.version'"),
    ],
)
def test_levels_outside_what_the_software_supports_are_refused(
    wide: Logic, update: tuple[str, int, int], fragment: str
) -> None:
    response, records = wide.update(update)
    assert records == []
    assert response.results[0].error_code == ErrorCode.INVALID_UPDATE_VERSION
    assert fragment in response.results[0].error_message


def test_direction_must_match_the_upgrade_type(wide: Logic) -> None:
    wide.update((MV, 2, UPGRADE))
    down, _ = wide.update((MV, 1, UPGRADE))
    assert "is a downgrade (use downgrade)" in down.results[0].error_message
    up, _ = wide.update((MV, 3, SAFE_DOWNGRADE))
    assert "is an upgrade (use upgrade)" in up.results[0].error_message


def test_a_safe_downgrade_is_allowed_only_across_levels_that_changed_nothing(wide: Logic) -> None:
    wide.update((MV, 3, UPGRADE))
    refused, records = wide.update((MV, 2, SAFE_DOWNGRADE))
    assert records == [] and refused.results[0].error_code == ErrorCode.INVALID_UPDATE_VERSION
    assert "would lose metadata: level 3 changed" in refused.results[0].error_message
    assert wide.logic.image.features[MV] == 3
    # 2 → 1 crosses only level 2, which changed nothing: allowed.
    wide2 = Logic({MV: 2}, {MV: (1, 3)})
    unsafe, records = wide2.update((MV, 1, UNSAFE_DOWNGRADE))
    assert records == [] and "unsafe downgrades are not supported" in unsafe.results[0].error_message
    ok, records = wide2.update((MV, 1, SAFE_DOWNGRADE))
    assert ok.results[0].error_code == ErrorCode.NONE and _levels(records) == [(MV, 1)]


def test_a_registered_broker_bounds_the_level(wide: Logic) -> None:
    old = pb.BrokerFeature(name=MV, min_supported_version=1, max_supported_version=2)
    assert wide.register(101, "inc-101", features=[old]).error_code == ErrorCode.NONE
    response, records = wide.update((MV, 3, UPGRADE))
    assert records == []
    assert "level 3 is not supported by broker 101 (1..2)" in response.results[0].error_message
    assert wide.update((MV, 2, UPGRADE))[0].results[0].error_code == ErrorCode.NONE


def test_one_refused_update_applies_none_of_the_request(wide: Logic) -> None:
    response, records = wide.update((MV, 2, UPGRADE), ("nosuch.version", 1, UPGRADE))
    assert records == []
    first, second = response.results
    assert (first.error_code, second.error_code) == (
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_UPDATE_VERSION,
    )
    assert "not applied" in first.error_message


def test_request_level_checks(wide: Logic) -> None:
    empty = update_features(wide.logic, cpb.UpdateFeaturesRequest(cluster_id=CLUSTER), len(wide.log))
    assert empty.response.error_code == ErrorCode.INVALID_REQUEST
    many = cpb.UpdateFeaturesRequest(
        cluster_id=CLUSTER, updates=[cpb.FeatureUpdate(feature=MV, max_version_level=1, upgrade_type=1)] * 17
    )
    assert update_features(wide.logic, many, len(wide.log)).response.error_code == ErrorCode.INVALID_REQUEST
    wrong = cpb.UpdateFeaturesRequest(cluster_id="other", updates=many.updates[:1])
    answer = update_features(wide.logic, wrong, len(wide.log)).response
    assert answer.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    twice, _ = wide.update((MV, 2, UPGRADE), (MV, 2, UPGRADE))
    assert "more than once" in twice.results[0].error_message
    bad_type, _ = wide.update((MV, 2, 9))
    assert bad_type.results[0].error_code == ErrorCode.INVALID_REQUEST


# ---- a broker restarted after kill -9 (kraft.broker.incarnation) ----


def test_a_new_incarnation_naming_the_registered_one_replaces_it_at_once(wide: Logic) -> None:
    wide.register(101, "inc-a")
    wide.unfence(101)
    old_epoch = wide.logic.image.brokers[101].epoch
    before = len(wide.log)
    # Another process with no proof waits for the old session (Kafka's rule) ...
    stranger = wide.register(101, "inc-b", previous="inc-x")
    assert stranger.error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    # ... the successor on the same log dirs does not: the old one is fenced, the new one registered.
    successor = wide.register(101, "inc-b", previous="inc-a")
    assert successor.error_code == ErrorCode.NONE and successor.broker_epoch > old_epoch
    broker = wide.logic.image.brokers[101]
    assert (broker.incarnation_id, broker.fenced, broker.epoch) == ("inc-b", True, successor.broker_epoch)
    # the old registration is fenced first, then the new one written
    fence, register = wide.log[before:]
    assert (fence.broker_registration_change.broker_epoch, fence.broker_registration_change.fenced) == (
        old_epoch,
        1,
    )
    assert register.register_broker.incarnation_id == "inc-b"
