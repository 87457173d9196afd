"""UpdateFeatures on the active controller (Kafka's FeatureControlManager): ``kraft features upgrade`` and
``kraft features downgrade``.

Each update names a feature, the level to finalize and whether it is an upgrade or a downgrade; every
update is checked before anything is written, and one refused update writes nothing (each result says
why: the refused one its reason, the others that they were not applied).  An accepted level is one
FeatureLevelRecord; the same level again is accepted and writes nothing, so a resent request is harmless.

Refused (INVALID_UPDATE_VERSION, one line each):

- a feature this controller does not know, or a level outside what its software supports
  (:data:`kraft.features.SUPPORTED_FEATURES`), or outside what a registered broker supports (its
  RegisterBroker features) — a broker could not read the metadata written at that level;
- an UPGRADE to a lower level, a downgrade to a higher one;
- an UNSAFE_DOWNGRADE (not supported, as in Kafka's KRaft mode), and a SAFE_DOWNGRADE across a level that
  changed the metadata (``changed_metadata`` in kraft.features): the image may hold records the lower
  level cannot represent.  Level 0 (removing metadata.version) is below every supported range.
"""

from __future__ import annotations

from collections import Counter

from kraft.errors import ErrorCode, KraftError
from kraft.features import MAX_FEATURE_UPDATES, METADATA_VERSION_FEATURE
from kraft.metadata.controller_logic import ControllerLogic, Outcome, _Batch, error_response
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

UPGRADE = 1
SAFE_DOWNGRADE = 2
UNSAFE_DOWNGRADE = 3
UPGRADE_TYPES = {UPGRADE: "upgrade", SAFE_DOWNGRADE: "safe downgrade", UNSAFE_DOWNGRADE: "unsafe downgrade"}


def _refuse(message: str) -> KraftError:
    return KraftError(ErrorCode.INVALID_UPDATE_VERSION, message)


def _lost_levels(logic: ControllerLogic, current: int, target: int) -> list[int]:
    """Levels above ``target`` up to ``current`` whose records the level below cannot represent."""
    versions = logic.settings.metadata_versions
    return [v.level for v in versions if target < v.level <= current and v.changed_metadata]


def check_update(logic: ControllerLogic, update: cpb.FeatureUpdate) -> int:
    """The level to finalize for ``update``; KraftError (INVALID_UPDATE_VERSION) when refused."""
    name, level = update.feature, update.max_version_level
    kind = UPGRADE_TYPES.get(update.upgrade_type)
    if kind is None:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"unknown upgrade type {update.upgrade_type}")
    supported = logic.settings.supported_features
    if name not in supported:
        raise _refuse(f"unknown feature {name!r}; this controller supports {', '.join(sorted(supported))}")
    current = logic.image.features.get(name, 0)
    low, high = supported[name]
    if not low <= level <= high:
        raise _refuse(f"{name} level {level} is not supported by this controller ({low}..{high})")
    for broker in sorted(logic.image.brokers.values(), key=lambda b: b.broker_id):
        for feature in broker.features:
            if feature.name == name and not feature.min_version <= level <= feature.max_version:
                raise _refuse(
                    f"{name} level {level} is not supported by broker {broker.broker_id} "
                    f"({feature.min_version}..{feature.max_version})"
                )
    if update.upgrade_type == UPGRADE and level < current:
        raise _refuse(f"{name} is at {current}: {level} is a downgrade (use downgrade)")
    if update.upgrade_type != UPGRADE and level > current:
        raise _refuse(f"{name} is at {current}: {level} is an upgrade (use upgrade)")
    if level < current:
        if update.upgrade_type == UNSAFE_DOWNGRADE:
            raise _refuse(f"unsafe downgrades are not supported ({name} {current} to {level})")
        lost = _lost_levels(logic, current, level) if name == METADATA_VERSION_FEATURE else []
        if lost:
            raise _refuse(
                f"{name} {current} to {level} would lose metadata: level {lost[-1]} changed what the "
                f"log holds, and level {level} cannot represent it"
            )
    return level


def update_features(
    logic: ControllerLogic, req: cpb.UpdateFeaturesRequest, next_offset: int
) -> Outcome[cpb.UpdateFeaturesResponse]:
    response = cpb.UpdateFeaturesResponse()
    try:
        logic.check_cluster_id(req.cluster_id)
        if not req.updates:
            raise KraftError(ErrorCode.INVALID_REQUEST, "no feature updates in the request")
        if len(req.updates) > MAX_FEATURE_UPDATES:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"{len(req.updates)} feature updates in one request; at most {MAX_FEATURE_UPDATES}",
            )
    except KraftError as exc:
        return Outcome([], error_response(response, exc.code, exc.message))
    repeats = Counter(u.feature for u in req.updates)
    levels: dict[str, int] = {}
    refused = False
    for update in req.updates:
        result = response.results.add(feature=update.feature)
        try:
            if repeats[update.feature] > 1:
                raise KraftError(
                    ErrorCode.INVALID_REQUEST, f"{update.feature} appears more than once in the request"
                )
            levels[update.feature] = check_update(logic, update)
        except KraftError as exc:
            error_response(result, exc.code, exc.message)
            refused = True
    if refused:
        for result in response.results:
            if result.error_code == ErrorCode.NONE:
                error_response(
                    result,
                    ErrorCode.INVALID_REQUEST,
                    "not applied: another update in the request was refused",
                )
        return Outcome([], response)
    batch = _Batch(logic, next_offset)
    if not req.validate_only:
        for name, level in levels.items():
            if logic.image.features.get(name) != level:
                batch.add(pb.FeatureLevelRecord(name=name, feature_level=level))
    return Outcome(batch.finish(), response, next_offset)


__all__ = ["SAFE_DOWNGRADE", "UNSAFE_DOWNGRADE", "UPGRADE", "check_update", "update_features"]
