"""Toxic definitions: the registered types, their attributes, and the JSON shape Toxiproxy uses.

A toxic is pure configuration here; what it *does* to bytes lives in ``chaos.proxy.link``.  Attribute
values are Go ``int64`` fields in Toxiproxy, so only JSON integers are accepted (a float or a string is a
400 there as well); unknown attribute keys are ignored, omitted ones keep their zero value (or, on
update, their previous value).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error the HTTP API reports as ``{"error": message, "status": status}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# The canonical messages of Toxiproxy's api.go; wrapped errors read "<wrapper>: <detail>".
BAD_REQUEST_BODY = "bad request body"
MISSING_FIELD = "missing required field"
PROXY_NOT_FOUND = "proxy not found"
PROXY_EXISTS = "proxy already exists"
INVALID_STREAM = "stream was invalid, can be either upstream or downstream"
INVALID_TOXIC_TYPE = "invalid toxic type"
TOXIC_EXISTS = "toxic already exists"
TOXIC_NOT_FOUND = "toxic not found"


class Direction(enum.Enum):
    """``upstream`` carries client→server bytes, ``downstream`` server→client bytes."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"


# type name -> attribute names in Toxiproxy's struct field order (all int64, default 0).
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "noop": (),
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}


@dataclass(slots=True)
class Toxic:
    """One toxic on one proxy.  ``stream`` is the string as sent (case kept), ``direction`` its meaning."""

    name: str
    type: str
    stream: str
    direction: Direction
    toxicity: float
    attributes: dict[str, int] = field(default_factory=dict)

    def attr(self, key: str) -> int:
        return self.attributes.get(key, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": float32_json(self.toxicity),
        }


def float32_json(value: float) -> float | int:
    """Go prints a float32 1.0 as ``1``; mirror that so byte-level comparisons with Toxiproxy hold."""
    return int(value) if value.is_integer() else value


def parse_direction(stream: str) -> Direction:
    lowered = stream.lower()
    for direction in Direction:
        if direction.value == lowered:
            return direction
    raise ApiError(400, INVALID_STREAM)


def _expect_int(key: str, value: Any) -> int:
    # bool is an int subclass in Python but not a JSON number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: attribute {key!r} must be an integer, got {value!r}")
    return value


def _expect_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: {key!r} must be a number, got {value!r}")
    return float(value)


def _expect_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: {key!r} must be a string, got {value!r}")
    return value


def _merge_attributes(kind: str, current: dict[str, int], raw: Any) -> dict[str, int]:
    if raw is None:
        return dict(current)
    if not isinstance(raw, dict):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: 'attributes' must be an object")
    merged = dict(current)
    for key in TOXIC_ATTRIBUTES[kind]:
        if key in raw:
            merged[key] = _expect_int(key, raw[key])
    return merged


def toxic_from_create_body(body: Any) -> Toxic:
    """Validate a ``POST /proxies/{p}/toxics`` body the way Toxiproxy does (stream before type)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: expected a JSON object")
    # Go decodes into pre-filled defaults: an omitted (or null) stream stays downstream, "" is invalid.
    stream = _expect_str("stream", body["stream"]) if body.get("stream") is not None else "downstream"
    direction = parse_direction(stream)
    kind = _expect_str("type", body.get("type", ""))
    if kind not in TOXIC_ATTRIBUTES:
        raise ApiError(400, INVALID_TOXIC_TYPE)
    name = _expect_str("name", body.get("name") or f"{kind}_{stream}")
    toxicity = _expect_float("toxicity", body["toxicity"]) if body.get("toxicity") is not None else 1.0
    defaults = {key: 0 for key in TOXIC_ATTRIBUTES[kind]}
    attributes = _merge_attributes(kind, defaults, body.get("attributes"))
    return Toxic(
        name=name, type=kind, stream=stream, direction=direction, toxicity=toxicity, attributes=attributes
    )


def updated_toxic(current: Toxic, body: Any) -> Toxic:
    """Decode an update *into* the existing toxic: only attributes and toxicity can change."""
    if not isinstance(body, dict):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: expected a JSON object")
    toxicity = (
        _expect_float("toxicity", body["toxicity"]) if body.get("toxicity") is not None else current.toxicity
    )
    attributes = _merge_attributes(current.type, current.attributes, body.get("attributes"))
    return Toxic(
        name=current.name,
        type=current.type,
        stream=current.stream,
        direction=current.direction,
        toxicity=toxicity,
        attributes=attributes,
    )
