"""Feature levels this software supports (Kafka's MetadataVersion and kafka-features.sh): the one place
that says which ``metadata.version`` levels exist, what release names them and which range this build
reads and writes.  ApiVersions reports the range from here, ``kraft storage format --release-version``
and ``kraft features upgrade|downgrade`` check against it, the controller bootstraps a new cluster at the
level the bootstrap checkpoint names (:mod:`kraft.metadata.bootstrap`) or, without one, at
:data:`LATEST_METADATA_VERSION`.

A level whose ``changed_metadata`` is set introduced records (or record meanings) that the level below
cannot represent: a safe downgrade across it is refused, as Kafka refuses a downgrade that would lose
metadata.  Today there is one level; the first change that needs a new one (e.g. the leader-epoch rule
in docs/internals/replication.md) adds a row here and gates its records on the image's level.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

METADATA_VERSION_FEATURE = "metadata.version"


@dataclass(frozen=True, slots=True)
class MetadataVersion:
    level: int
    release: str
    """``<kraft release>-IV<n>`` as Kafka's "3.7-IV4"; ``--release-version 0.1`` names the latest IV."""
    changed_metadata: bool
    """Records written at this level may not be readable at the level below (a downgrade loses them)."""


METADATA_VERSIONS: tuple[MetadataVersion, ...] = (MetadataVersion(1, "0.1-IV0", changed_metadata=True),)
"""Every level this software knows, ascending."""

MINIMUM_METADATA_VERSION = METADATA_VERSIONS[0].level
LATEST_METADATA_VERSION = METADATA_VERSIONS[-1].level

SUPPORTED_FEATURES: Mapping[str, tuple[int, int]] = {
    METADATA_VERSION_FEATURE: (MINIMUM_METADATA_VERSION, LATEST_METADATA_VERSION),
}
"""Feature → (min, max) level this software reads and writes (ApiVersions' supported_features)."""

MAX_FEATURE_UPDATES = 16
"""Updates in one UpdateFeatures request (more than every known feature: a bound on the work)."""

_LEVEL = re.compile(r"\d{1,9}")


def release_of(level: int) -> str | None:
    """The release name of a metadata.version level, None when this software does not know it."""
    return next((v.release for v in METADATA_VERSIONS if v.level == level), None)


def _known_releases() -> str:
    return ", ".join(v.release for v in METADATA_VERSIONS)


def metadata_version_of_release(text: str) -> int:
    """``0.1`` (the latest level of that release) or ``0.1-IV0`` → its metadata.version level; ValueError
    (one line, naming the known releases) otherwise."""
    name = text.strip()
    matches = [v for v in METADATA_VERSIONS if v.release == name or v.release.split("-IV")[0] == name]
    if not matches:
        raise ValueError(f"unknown release version {text!r}; this software supports {_known_releases()}")
    return matches[-1].level


def parse_feature_level(text: str) -> tuple[str, int]:
    """``name=level`` (``--feature``) → (name, level); ValueError for a bad shape."""
    name, sep, level = text.partition("=")
    name, level = name.strip(), level.strip()
    if not sep or not name or not _LEVEL.fullmatch(level):
        raise ValueError(f"{text!r} is not name=level (e.g. {METADATA_VERSION_FEATURE}=1)")
    return name, int(level)


def check_supported(
    name: str, level: int, supported: Mapping[str, tuple[int, int]] = SUPPORTED_FEATURES
) -> None:
    """ValueError (one line) unless ``level`` of feature ``name`` is one this software supports."""
    if name not in supported:
        raise ValueError(f"unknown feature {name!r}; this software supports {', '.join(sorted(supported))}")
    low, high = supported[name]
    if not low <= level <= high:
        raise ValueError(f"{name} level {level} is not supported; this software supports {low}..{high}")


def requested_levels(
    release_version: str | None, features: list[str], *, check: bool = True
) -> dict[str, int]:
    """The levels named by ``--release-version`` and ``--feature name=level`` (format, upgrade, downgrade);
    ValueError (one line) for anything wrong.  ``check``: each must be supported by this software (at
    format time; an upgrade is checked by the controller, whose software may be newer than the tool's)."""
    levels: dict[str, int] = {}
    if release_version is not None:
        levels[METADATA_VERSION_FEATURE] = metadata_version_of_release(release_version)
    for text in features:
        name, level = parse_feature_level(text)
        if name in levels:
            raise ValueError(
                f"{name} is given more than once (--release-version sets {METADATA_VERSION_FEATURE})"
            )
        levels[name] = level
    if check:
        for name, level in levels.items():
            check_supported(name, level)
    return levels
