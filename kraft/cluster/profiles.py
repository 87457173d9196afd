"""Timing profiles for generated clusters: Kafka's defaults, or a fast one for laptops and tests.

A profile is a set of config overrides (Kafka keys → values) applied to every generated node.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

DEFAULT: Final[Mapping[str, str]] = MappingProxyType({})

# Elections in ~0.5-1 s and brokers fenced after 3 s: quick feedback on loopback, yet tolerant of the
# event-loop stalls a loaded 2-core machine produces (a fetch timeout below ~1 s made leaders flap while
# several Python processes were starting at once).  Heartbeat 300 ms vs session 3 s = 10 missed beats.
FAST: Final[Mapping[str, str]] = MappingProxyType(
    {
        "controller.quorum.election.timeout.ms": "500",
        "controller.quorum.fetch.timeout.ms": "1000",
        "controller.quorum.election.backoff.max.ms": "500",
        "controller.quorum.request.timeout.ms": "1000",
        "controller.quorum.retry.backoff.ms": "20",
        "controller.quorum.append.linger.ms": "5",
        "controller.quorum.fetch.max.wait.ms": "200",
        "metadata.max.idle.interval.ms": "200",
        "broker.heartbeat.interval.ms": "300",
        "broker.session.timeout.ms": "3000",
    }
)

PROFILES: Final[Mapping[str, Mapping[str, str]]] = MappingProxyType({"default": DEFAULT, "fast": FAST})


def profile_overrides(name: str) -> Mapping[str, str]:
    """The overrides of profile ``name``; ``ValueError`` naming the known profiles otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}: expected one of {', '.join(PROFILES)}") from None
