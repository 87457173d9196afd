"""Node configuration: Kafka-style ``.properties`` files parsed into a validated pydantic model.

``parse_properties`` follows ``java.util.Properties.load`` exactly (comments, separators, line
continuations, escapes), so a Kafka operator's file means the same thing here.  ``NodeConfig`` holds the
keys of docs/configuration.md under Kafka's names (attribute = key with ``.`` → ``_``).  Every failure —
unknown key, bad value, missing required key, inconsistent combination — is a :class:`ConfigError` whose
message is one line naming the key, the value and the rule.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from kraft.errors import ErrorCode, KraftError
from kraft.security.authorizer import AUTHORIZER_NAMES, AuthorizerSettings, parse_super_users
from kraft.security.mapping import MappingRuleError, parse_rules

# ---------------------------------------------------------------------------------------------------------
# Errors


class ConfigError(KraftError):
    """A configuration problem, reported as one line: ``key=value: rule``."""

    def __init__(self, message: str, *, key: str | None = None, value: str | None = None) -> None:
        super().__init__(ErrorCode.INVALID_CONFIG, message)
        self.key = key
        self.value = value

    def __str__(self) -> str:
        return self.message

    @classmethod
    def for_key(cls, key: str, value: object, rule: str) -> ConfigError:
        shown = value if isinstance(value, str) else _render(value)
        return cls(f"invalid config {key}={shown!r}: {rule}", key=key, value=shown)


# ---------------------------------------------------------------------------------------------------------
# java.util.Properties syntax

_WHITESPACE: Final = " \t\f"
_SIMPLE_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """Yield (line number, logical line) pairs: comments and blank lines dropped, continuations joined.

    A natural line continues when it ends in an odd number of backslashes; the continuation's leading
    whitespace is discarded.  Comment lines never continue (as in Java).
    """
    natural = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    index = 0
    while index < len(natural):
        start = index
        line = natural[index].lstrip(_WHITESPACE)
        index += 1
        if not line or line[0] in "#!":
            continue
        parts: list[str] = []
        while True:
            trailing = len(line) - len(line.rstrip("\\"))
            if trailing % 2 == 0 or index >= len(natural):
                # A final odd backslash at end of input is dropped, as Java does.
                parts.append(line[:-1] if trailing % 2 else line)
                break
            parts.append(line[:-1])
            line = natural[index].lstrip(_WHITESPACE)
            index += 1
        yield start + 1, "".join(parts)


def _unescape(raw: str, line_no: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\" or i + 1 >= len(raw):
            out.append(ch)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            digits = raw[i + 2 : i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"line {line_no}: malformed \\uxxxx escape {raw[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_SIMPLE_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_key_value(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped ``=``, ``:`` or whitespace (raw, still escaped)."""
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:" or ch in _WHITESPACE:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):  # at most one separator; a second one belongs to the value
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def parse_properties(text: str) -> dict[str, str]:
    """Parse ``.properties`` text exactly as ``java.util.Properties.load``; later keys win."""
    result: dict[str, str] = {}
    for line_no, line in _logical_lines(text):
        raw_key, raw_value = _split_key_value(line)
        result[_unescape(raw_key, line_no)] = _unescape(raw_value, line_no)
    return result


def _escape(text: str, *, is_key: bool) -> str:
    out: list[str] = []
    for pos, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[ch])
        elif ch in "=:#!" and is_key:  # in a value only the first separator counts, so no escape
            out.append("\\" + ch)
        elif ch == " " and (is_key or pos == 0):
            out.append("\\ ")
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else ch)
        else:
            out.append(ch)
    return "".join(out)


def format_properties(values: Mapping[str, str], header: str | None = None) -> str:
    """Render ``key=value`` lines that :func:`parse_properties` (and Java) read back unchanged."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    lines.extend(f"{_escape(k, is_key=True)}={_escape(v, is_key=False)}" for k, v in values.items())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Typed values


class Role(enum.StrEnum):
    BROKER = "broker"
    CONTROLLER = "controller"


def _split_host_port(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); raises ValueError with the rule."""
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not re.fullmatch(r"\d{1,5}", port_text):
        raise ValueError(f"{text!r} is not host:port")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    return host, port


def split_host_port(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); raises ValueError with the rule."""
    return _split_host_port(text)


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class Voter:
    """One entry of ``controller.quorum.voters``: ``id@host:port``."""

    id: int
    host: str
    port: int

    @property
    def target(self) -> str:
        """The gRPC target string (``host:port``, IPv6 bracketed)."""
        return _join_host_port(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.id}@{self.target}"


@dataclass(frozen=True, slots=True)
class Listener:
    """One entry of ``listeners``: ``NAME://host:port`` (an empty host means every interface)."""

    name: str
    host: str
    port: int

    @property
    def bind_address(self) -> str:
        """What a gRPC server binds (``0.0.0.0:port`` for an empty host)."""
        return _join_host_port(self.host or "0.0.0.0", self.port)

    @property
    def target(self) -> str:
        """What a client on this machine dials (``127.0.0.1`` for a wildcard host)."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return _join_host_port(host, self.port)

    def __str__(self) -> str:
        return f"{self.name}://{_join_host_port(self.host, self.port) if self.host else f':{self.port}'}"


def parse_voters(text: str) -> tuple[Voter, ...]:
    """``1@h:9093,2@h:9094`` → voters; raises ValueError naming the bad entry."""
    voters: list[Voter] = []
    for entry in _comma_list(text):
        node, sep, address = entry.partition("@")
        if not sep or not re.fullmatch(r"\d+", node):
            raise ValueError(f"entry {entry!r} is not id@host:port")
        host, port = _split_host_port(address)
        if not host or port == 0:
            raise ValueError(f"entry {entry!r} needs a host and a port in 1..65535")
        voters.append(Voter(int(node), host, port))
    if not voters:
        raise ValueError("must list at least one voter as id@host:port")
    ids = [v.id for v in voters]
    if len(set(ids)) != len(ids):
        raise ValueError("voter ids must be unique")
    return tuple(voters)


def parse_advertised_listeners(text: str) -> tuple[Listener, ...]:
    """Like :func:`parse_listeners`, but empty means none (every listener advertises itself)."""
    return parse_listeners(text) if text.strip() else ()


def parse_listeners(text: str) -> tuple[Listener, ...]:
    """``CONTROLLER://h:9093,PLAINTEXT://:9092`` → listeners; names are upper-cased as Kafka does."""
    listeners: list[Listener] = []
    for entry in _comma_list(text):
        name, sep, address = entry.partition("://")
        if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            raise ValueError(f"entry {entry!r} is not NAME://host:port")
        host, port = _split_host_port(address)
        listeners.append(Listener(name.upper(), host, port))
    if not listeners:
        raise ValueError("must list at least one listener as NAME://host:port")
    names = [lst.name for lst in listeners]
    if len(set(names)) != len(names):
        raise ValueError("listener names must be unique")
    return tuple(listeners)


def parse_bootstrap_servers(text: str) -> tuple[str, ...]:
    """``h1:9093,h2:9093`` (``controller.quorum.bootstrap.servers``) → ``host:port`` targets."""
    servers: list[str] = []
    for entry in _comma_list(text):
        host, port = _split_host_port(entry)
        if not host or port == 0:
            raise ValueError(f"entry {entry!r} needs a host and a port in 1..65535")
        servers.append(_join_host_port(host, port))
    if not servers:
        raise ValueError("must list at least one controller as host:port")
    if len(set(servers)) != len(servers):
        raise ValueError("entries must be unique")
    return tuple(servers)


def bootstrap_server_id(index: int) -> int:
    """The pseudo node id of the ``index``-th bootstrap server (Kafka: -2, -3, …; -1 is "no leader")."""
    return -2 - index


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


# --- pydantic field types: strings from a .properties file, or already-typed values from Python code ---


def _int_rule(minimum: int, maximum: int | None = None) -> BeforeValidator:
    rule = f"must be an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")

    def parse(value: object) -> int:
        if isinstance(value, bool):
            raise ValueError(rule)
        if isinstance(value, str):
            if not re.fullmatch(r"[+-]?\d+", value.strip()):
                raise ValueError(rule)
            value = int(value.strip())
        if not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
            raise ValueError(rule)
        return value

    return BeforeValidator(parse)


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("must be true or false")


def _items(value: object) -> list[str]:
    """A comma list from a file, or the items of a sequence given from Python code."""
    if isinstance(value, str):
        return _comma_list(value)
    if isinstance(value, Iterable):
        return [str(item).strip() for item in value]
    raise ValueError("must be a comma list")


def _parse_roles(value: object) -> frozenset[Role]:
    items = _items(value)
    try:
        roles = frozenset(Role(str(item).strip().lower()) for item in items)
    except ValueError:
        roles = frozenset()
    if not roles or len(roles) != len(items):
        raise ValueError("must be 'broker', 'controller' or 'broker,controller'")
    return roles


def _typed_or_parsed(parser: Any, kind: type) -> BeforeValidator:
    def parse(value: object) -> object:
        if isinstance(value, str):
            return parser(value)
        if isinstance(value, Iterable) and all(isinstance(v, kind) for v in value):
            return tuple(value)
        raise ValueError(f"must be a string or a sequence of {kind.__name__}")

    return BeforeValidator(parse)


def _parse_names(value: object) -> tuple[str, ...]:
    names = _items(value)
    if not names:
        raise ValueError("must be a non-empty comma list")
    return tuple(name.upper() for name in names)


def _parse_paths(value: object) -> tuple[Path, ...]:
    return tuple(Path(item) for item in _items(value))


def _parse_optional_path(value: object) -> Path | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return Path(str(value).strip())


def _parse_optional_str(value: object) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value).strip()


def _parse_level(value: object) -> str:
    text = str(value).strip().upper()
    if text == "WARN":
        text = "WARNING"
    if text not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
    return text


SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL")


@dataclass(frozen=True, slots=True)
class ProtocolMapping:
    """One entry of ``listener.security.protocol.map``: ``NAME:PROTOCOL``."""

    name: str
    protocol: str

    def __str__(self) -> str:
        return f"{self.name}:{self.protocol}"


def parse_protocol_map(text: str) -> tuple[ProtocolMapping, ...]:
    """``CONTROLLER:SSL,BROKER:SSL`` → mappings; PLAINTEXT and SSL only (SASL is not supported)."""
    mappings: list[ProtocolMapping] = []
    for entry in _comma_list(text):
        name, sep, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            raise ValueError(f"entry {entry!r} is not LISTENER_NAME:PROTOCOL")
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"entry {entry!r}: protocol must be PLAINTEXT or SSL (SASL is not supported)")
        mappings.append(ProtocolMapping(name, protocol))
    names = [mapping.name for mapping in mappings]
    if len(set(names)) != len(names):
        raise ValueError("listener names must be unique")
    return tuple(mappings)


def _parse_pem_type(value: object) -> str:
    if str(value).strip().upper() != "PEM":
        raise ValueError("only PEM is supported")
    return "PEM"


def _parse_client_auth(value: object) -> str:
    text = str(value).strip().lower()
    if text == "requested":
        raise ValueError(
            "'requested' is not supported (grpcio either requires a client certificate or does not ask "
            "for one): use required or none"
        )
    if text not in ("required", "none"):
        raise ValueError("must be required or none")
    return text


def _parse_mapping_rules(value: object) -> str:
    text = str(value).strip() or "DEFAULT"
    try:
        parse_rules(text)
    except MappingRuleError as exc:
        raise ValueError(str(exc)) from None
    return text


def _parse_pem_text(value: object) -> str | None:
    text = _parse_optional_str(value)
    if text is not None and "-----BEGIN" not in text:
        raise ValueError("holds the PEM text itself (Kafka's meaning); for a file use the .location key")
    return text


def _parse_authorizer(value: object) -> str:
    text = "" if value is None else str(value).strip()
    if text and text not in AUTHORIZER_NAMES:
        raise ValueError(f"must be empty (no authorizer) or one of {', '.join(sorted(AUTHORIZER_NAMES))}")
    return text


def _parse_super_users(value: object) -> frozenset[str]:
    if isinstance(value, frozenset | set | tuple | list):
        value = ";".join(str(v) for v in value)
    return parse_super_users(str(value))


DEFAULT_MESSAGE_MAX_BYTES = 1048588
GRPC_ENVELOPE_BYTES = 64 * 1024
"""Room kept in a gRPC message besides one record batch's content: a Produce request's topic, cluster
id and per-record fields, a Fetch response's offsets and epochs (a few hundred bytes; 64 KiB is generous
and leaves the rule easy to state)."""
REPLICA_FETCH_WAIT_MAX_MS = 10_000
"""Upper bound of ``replica.fetch.wait.max.ms``: the longest a leader parks a follower's fetch."""

DEFAULT_MAX_PARKED_FETCHES = 1000
"""fetch.max.parked.requests: long-polling Fetch/MetadataFetch requests one server holds at once."""

Ms = Annotated[int, _int_rule(1)]
NonNegative = Annotated[int, _int_rule(0)]
Positive = Annotated[int, _int_rule(1)]
Port = Annotated[int, _int_rule(0, 65535)]
Bool = Annotated[bool, BeforeValidator(_parse_bool)]


def _key(name: str, **kwargs: Any) -> Any:
    return Field(alias=name, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# The model


class NodeConfig(BaseModel):
    """One node's configuration; build it with :meth:`from_properties` or :func:`load_config`."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    process_roles: Annotated[frozenset[Role], BeforeValidator(_parse_roles)] = _key("process.roles")
    node_id: NonNegative = _key("node.id")
    controller_quorum_voters: Annotated[tuple[Voter, ...], _typed_or_parsed(parse_voters, Voter)] = _key(
        "controller.quorum.voters", default=()
    )
    controller_quorum_bootstrap_servers: Annotated[
        tuple[str, ...], _typed_or_parsed(parse_bootstrap_servers, str)
    ] = _key("controller.quorum.bootstrap.servers", default=())
    listeners: Annotated[tuple[Listener, ...], _typed_or_parsed(parse_listeners, Listener)] = _key(
        "listeners"
    )
    advertised_listeners: Annotated[
        tuple[Listener, ...], _typed_or_parsed(parse_advertised_listeners, Listener)
    ] = _key("advertised.listeners", default=())
    """What a broker registers (and clients and other brokers dial) for a listener, when that differs from
    where it binds (NAT, a proxy in front): Kafka's ``advertised.listeners``; unnamed listeners advertise
    their ``listeners`` address."""
    controller_listener_names: Annotated[tuple[str, ...], BeforeValidator(_parse_names)] = _key(
        "controller.listener.names", default=("CONTROLLER",)
    )
    log_dirs: Annotated[tuple[Path, ...], BeforeValidator(_parse_paths)] = _key("log.dirs", default=())
    metadata_log_dir: Annotated[Path | None, BeforeValidator(_parse_optional_path)] = _key(
        "metadata.log.dir", default=None
    )
    controller_quorum_election_timeout_ms: Ms = _key("controller.quorum.election.timeout.ms", default=1000)
    controller_quorum_fetch_timeout_ms: Ms = _key("controller.quorum.fetch.timeout.ms", default=2000)
    controller_quorum_election_backoff_max_ms: Ms = _key(
        "controller.quorum.election.backoff.max.ms", default=1000
    )
    # Group commit: an upper bound, not a fixed delay.  An append is written at once while no flush of the
    # metadata log is in flight; while one is, appends gather and are written together when it completes,
    # or when this bound (counted from the first waiting append) expires.  0 = never wait.
    controller_quorum_append_linger_ms: NonNegative = _key("controller.quorum.append.linger.ms", default=25)
    controller_quorum_request_timeout_ms: Ms = _key("controller.quorum.request.timeout.ms", default=2000)
    # Check-quorum leader lease (kraft only, issue #17): the active controller answers a heartbeat that
    # changes nothing without a leadership round while a majority of voters is provably still refusing to
    # vote for anyone else (docs/internals/raft.md "Leader lease").  false: every such answer waits for
    # a round.  The promise it relies on (voters refusing votes) is kept either way.
    controller_quorum_leader_lease_enable: Bool = _key("controller.quorum.leader.lease.enable", default=True)
    controller_quorum_retry_backoff_ms: NonNegative = _key("controller.quorum.retry.backoff.ms", default=20)
    controller_quorum_fetch_max_wait_ms: NonNegative = _key(
        "controller.quorum.fetch.max.wait.ms", default=500
    )
    # kraft only (issue #17, session 15): the longest the leader holds a Fetch with nothing new to send
    # whose follower would learn a higher high watermark from it, so that the next batch carries it with
    # its records; then it answers with the high watermark alone.  0 = at once (Kafka 4.1's KIP-1166).
    controller_quorum_fetch_high_watermark_wait_ms: NonNegative = _key(
        "controller.quorum.fetch.high.watermark.wait.ms", default=10
    )
    # kraft only (issue #17): a follower hands newly committed batches to its listeners (the metadata
    # replay) this long after the first of them committed, all at once, instead of at once — off the
    # moment the leader needs the cores to finish the write.  0 = at once.
    controller_quorum_follower_listener_delay_ms: NonNegative = _key(
        "controller.quorum.follower.listener.delay.ms", default=20
    )
    # The most records one controller event computes and appends; bulk operations (large CreateTopics /
    # DeleteTopics, a broker leaving 100,000 ISRs, unfence elections) continue in further events, with
    # heartbeats and registrations served first in between (kraft/metadata/event_queue.py).
    controller_max_work_unit_records: Positive = _key("controller.max.work.unit.records", default=1000)
    # The time budget of one such event (and of each slice of a committed batch's replay), read on the
    # controller's clock; a slice ends at whichever of the two bounds comes first.  0 = records only.
    controller_max_event_time_ms: NonNegative = _key("controller.max.event.time.ms", default=5)
    # The request plane apart from the state machine: the controller node's gRPC server runs on its own
    # thread and event loop; every handler still runs on the main loop (kraft/node/intake.py).
    controller_request_intake_thread: Bool = _key("controller.request.intake.thread", default=True)
    # With the intake thread: Raft's Fetch/FetchStream are served on its loop and reach the driver through
    # one hop each way (kraft.node.intake.DriverBridge); false: they hop to the main loop like every other
    # handler.  A switch for A/B measurements (docs/internals/raft-performance.md).
    controller_raft_fetch_on_intake: Bool = _key("controller.raft.fetch.on.intake", default=True)
    # With the intake thread and kraft.test.append.enable: TestAppend/TestAppendStream are served on its
    # loop and the appends of many calls reach the driver as one hand-off (kraft.node.intake.AppendBridge);
    # false: they hop to the main loop one call at a time like every other handler.  For A/B measurements
    # (docs/internals/raft-performance.md, "The leader's cost per write and per record (session 11)").
    controller_raft_test_append_on_intake: Bool = _key("controller.raft.test.append.on.intake", default=True)
    # With the intake thread and the metadata layer: BrokerHeartbeat is served on its loop and the calls that
    # arrive while the previous hand-off waits reach the controller as one event
    # (kraft.node.controller_bridge.HeartbeatBridge; each call checked and answered on its own); false: they
    # hop to the main loop one call at a time like every other handler.  Off by default: no CreateTopics
    # gain was measurable on the shared host (docs/internals/raft-performance.md, "CreateTopics with 1,000
    # brokers (session 12)"); a switch for A/B measurements.
    controller_broker_heartbeats_on_intake: Bool = _key(
        "controller.broker.heartbeats.on.intake", default=False
    )
    # With the intake thread and the metadata layer: a *steady* BrokerHeartbeat (one the controller would
    # answer with no record and only is_caught_up) is answered on the intake thread from a snapshot the
    # main loop publishes, while the Raft leader lease holds, without the main loop
    # (kraft.metadata.heartbeat_lane; docs/internals/heartbeat-lane.md); the others take the
    # HeartbeatBridge path (on with this key whatever controller.broker.heartbeats.on.intake says).
    controller_broker_heartbeats_fast_lane: Bool = _key(
        "controller.broker.heartbeats.fast.lane", default=True
    )
    # With the intake thread: while this controller leads, only the intake loop reads grpc.aio's completion-
    # queue wake-ups (one socket every loop with a grpc.aio object watches); the main loop gets only its own
    # events, posted to it (kraft/node/grpc_poller.py).  false: both loops are woken by every gRPC event, as
    # grpc.aio does by itself.  A switch for A/B measurements (docs/internals/raft-performance.md, "The
    # leader's main loop and grpc.aio's wake-ups (session 14)").
    controller_leader_grpc_events_on_intake: Bool = _key(
        "controller.leader.grpc.events.on.intake", default=True
    )
    # With the intake thread: while this controller does not lead, only the main loop reads those wake-ups
    # (its fetch client's events are nearly all there are); the intake loop gets its own events posted to it.
    # false: a follower's intake thread is woken by every event of its fetches too, as grpc.aio does by
    # itself.  A switch for A/B measurements (docs/internals/raft-performance.md, "A follower's intake loop
    # and grpc.aio's wake-ups (session 14)").
    controller_follower_grpc_events_on_main: Bool = _key(
        "controller.follower.grpc.events.on.main", default=True
    )
    # The Python GIL switch interval a controller with the metadata layer runs with, in µs
    # (kraft/node/metadata_layer.py GIL_SWITCH_INTERVAL_S: short, so the intake thread gets the GIL soon
    # while the main loop runs bulk work).  A knob for A/B measurements (docs/internals/raft-performance.md,
    # "The leader's main loop and grpc.aio's wake-ups (session 14)").
    controller_gil_switch_interval_us: Positive = _key("controller.gil.switch.interval.us", default=100)
    # The image store's save waits while the committed log moves at a bulk rate, at most this long after
    # the last save (kraft.metadata.store_writer; 0 = never waits, as before session 15).
    controller_image_store_bulk_defer_max_ms: NonNegative = _key(
        "controller.image.store.bulk.defer.max.ms", default=10_000
    )
    # The most prepared topics of one CreateTopics placed and built at once, the rest waiting in the
    # request's order (kraft.metadata.controller; 0 = all at once, as before session 16).  A knob for
    # A/B measurements (docs/internals/raft-performance.md, session 16's bulk creation).
    controller_create_topics_preparing_max: NonNegative = _key(
        "controller.create.topics.preparing.max", default=0
    )
    # A large save writes its rows 2,000 per statement in one transaction and pauses this many percent of
    # each chunk's time before the next (kraft.metadata.store; 0 = no pause).  A knob for A/B measurements.
    controller_image_store_save_pause_percent: NonNegative = _key(
        "controller.image.store.save.pause.percent", default=0
    )
    # After bulk work each controller's deferred image-store save waits for its own log to stay quiet this
    # much longer per slot: followers 0 and 1, the active controller 2 (kraft.metadata.store_writer; 0 = each
    # saves once its log is quiet, as in session 15).
    controller_image_store_bulk_save_stagger_ms: NonNegative = _key(
        "controller.image.store.bulk.save.stagger.ms", default=3_000
    )
    # Intake processes (issue #17): this many child processes bind the controller's port too (SO_REUSEPORT),
    # take the connections the kernel gives them, batch TestAppend calls and proxy everything else to the
    # node over a unix socket (kraft/node/intake_process.py), the caller's TLS identity and address with it.
    # 0 = none.
    controller_intake_processes: NonNegative = _key("controller.intake.processes", default=0)
    # With intake processes: true = the node's own process does not listen on the CONTROLLER port at all, so
    # every connection (clients', and Raft peers' too) reaches it through an intake process; false = the
    # kernel spreads connections over the node's process and its intake processes alike.
    controller_intake_exclusive: Bool = _key("controller.intake.exclusive", default=False)
    # With intake processes: BrokerHeartbeat and CreateTopics calls of one intake loop turn go to the node as
    # one internal batch (kraft/node/intake_batch.py); false = proxied one by one like every other call.
    controller_intake_batch_controller_calls: Bool = _key(
        "controller.intake.batch.controller.calls", default=True
    )
    broker_heartbeat_interval_ms: Ms = _key("broker.heartbeat.interval.ms", default=2000)
    broker_session_timeout_ms: Ms = _key("broker.session.timeout.ms", default=9000)
    # A broker sends its heartbeats over one long-lived BrokerHeartbeatStream to the active controller
    # (kraft/client/heartbeat_stream.py; unary where a controller answers UNIMPLEMENTED); false: one unary
    # BrokerHeartbeat call each (docs/internals/raft-performance.md, "Heartbeats over one stream per broker
    # (session 15)").
    broker_heartbeat_stream: Bool = _key("broker.heartbeat.stream", default=True)
    initial_broker_registration_timeout_ms: Ms = _key("initial.broker.registration.timeout.ms", default=60000)
    broker_rack: Annotated[str | None, BeforeValidator(_parse_optional_str)] = _key(
        "broker.rack", default=None
    )
    metadata_log_segment_bytes: Positive = _key("metadata.log.segment.bytes", default=1073741824)
    metadata_log_segment_ms: Ms = _key("metadata.log.segment.ms", default=604800000)
    metadata_max_retention_bytes: Annotated[int, _int_rule(-1)] = _key(
        "metadata.max.retention.bytes", default=104857600
    )
    metadata_max_retention_ms: Annotated[int, _int_rule(-1)] = _key(
        "metadata.max.retention.ms", default=604800000
    )
    metadata_log_max_record_bytes_between_snapshots: Positive = _key(
        "metadata.log.max.record.bytes.between.snapshots", default=20971520
    )
    metadata_log_max_snapshot_interval_ms: NonNegative = _key(
        "metadata.log.max.snapshot.interval.ms", default=3600000
    )
    metadata_max_idle_interval_ms: NonNegative = _key("metadata.max.idle.interval.ms", default=500)
    log_segment_bytes: Positive = _key("log.segment.bytes", default=1073741824)
    num_partitions: Positive = _key("num.partitions", default=1)
    default_replication_factor: Positive = _key("default.replication.factor", default=1)
    # CreateTopics limits, checked by the active controller (defaults: kraft.metadata.controller_logic).
    max_partitions: Positive = _key("max.partitions", default=1_000_000)
    max_broker_partitions: Positive = _key("max.broker.partitions", default=10_000)
    # Largest record batch a Produce may append (Kafka's default); a topic's max.message.bytes overrides it.
    message_max_bytes: NonNegative = _key("message.max.bytes", default=DEFAULT_MESSAGE_MAX_BYTES)
    # Partition replication (brokers; Kafka's names and defaults; docs/configuration.md "Replication").
    min_insync_replicas: Positive = _key("min.insync.replicas", default=1)
    replica_lag_time_max_ms: Ms = _key("replica.lag.time.max.ms", default=30000)
    replica_fetch_wait_max_ms: Annotated[int, _int_rule(0, REPLICA_FETCH_WAIT_MAX_MS)] = _key(
        "replica.fetch.wait.max.ms", default=500
    )
    replica_fetch_max_bytes: Positive = _key("replica.fetch.max.bytes", default=1048576)
    replica_fetch_response_max_bytes: Positive = _key("replica.fetch.response.max.bytes", default=10485760)
    replica_fetch_backoff_ms: NonNegative = _key("replica.fetch.backoff.ms", default=1000)
    replica_socket_timeout_ms: Ms = _key("replica.socket.timeout.ms", default=30000)
    replica_high_watermark_checkpoint_interval_ms: Ms = _key(
        "replica.high.watermark.checkpoint.interval.ms", default=5000
    )
    unclean_leader_election_enable: Bool = _key("unclean.leader.election.enable", default=False)
    # Segment files a broker keeps open at once (an LRU, reopened on use); 0 = half the open-file limit.
    log_open_segment_files_max: NonNegative = _key("log.open.segment.files.max", default=0)
    metrics_port: Port = _key("metrics.port", default=0)
    # Event-loop lag and GIL-wait samplers of a controller node (kraft.observability.stall_sampler); 0 = off.
    observability_stall_sampler_ms: NonNegative = _key("observability.stall.sampler.ms", default=0)
    # Transport security (kraft.security.tls, docs/security.md): Kafka's names, PEM only.
    listener_security_protocol_map: Annotated[
        tuple[ProtocolMapping, ...], _typed_or_parsed(parse_protocol_map, ProtocolMapping)
    ] = _key("listener.security.protocol.map", default=())
    ssl_keystore_type: Annotated[str, BeforeValidator(_parse_pem_type)] = _key(
        "ssl.keystore.type", default="PEM"
    )
    ssl_keystore_location: Annotated[Path | None, BeforeValidator(_parse_optional_path)] = _key(
        "ssl.keystore.location", default=None
    )
    ssl_keystore_certificate_chain: Annotated[str | None, BeforeValidator(_parse_pem_text)] = _key(
        "ssl.keystore.certificate.chain", default=None
    )
    ssl_keystore_key: Annotated[str | None, BeforeValidator(_parse_pem_text)] = _key(
        "ssl.keystore.key", default=None
    )
    ssl_truststore_type: Annotated[str, BeforeValidator(_parse_pem_type)] = _key(
        "ssl.truststore.type", default="PEM"
    )
    ssl_truststore_location: Annotated[Path | None, BeforeValidator(_parse_optional_path)] = _key(
        "ssl.truststore.location", default=None
    )
    ssl_truststore_certificates: Annotated[str | None, BeforeValidator(_parse_pem_text)] = _key(
        "ssl.truststore.certificates", default=None
    )
    ssl_client_auth: Annotated[str, BeforeValidator(_parse_client_auth)] = _key(
        "ssl.client.auth", default="none"
    )
    ssl_principal_mapping_rules: Annotated[str, BeforeValidator(_parse_mapping_rules)] = _key(
        "ssl.principal.mapping.rules", default="DEFAULT"
    )
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(_parse_level)] = _key(
        "log.level", default="INFO"
    )
    grpc_max_message_bytes: Annotated[int, _int_rule(1024)] = _key("grpc.max.message.bytes", default=16777216)
    kraft_test_append_enable: Bool = _key("kraft.test.append.enable", default=False)
    # Authorization (docs/security.md): empty = no authorizer, everything allowed (development).
    authorizer_class_name: Annotated[str, BeforeValidator(_parse_authorizer)] = _key(
        "authorizer.class.name", default=""
    )
    super_users: Annotated[frozenset[str], BeforeValidator(_parse_super_users)] = _key(
        "super.users", default=frozenset()
    )
    allow_everyone_if_no_acl_found: Bool = _key("allow.everyone.if.no.acl.found", default=False)
    # --- hardening (issue #15; docs/configuration.md "Connections and request limits") ---
    # Prometheus endpoint address (default: the host of this node's first listener, never 0.0.0.0 unasked).
    metrics_host: Annotated[str | None, BeforeValidator(_parse_optional_str)] = _key(
        "metrics.host", default=None
    )
    # Every gRPC listener: connection cap, idle connections closed, handshake deadline, keepalive.
    max_connections: Positive = _key("max.connections", default=1000)
    connections_max_idle_ms: Ms = _key("connections.max.idle.ms", default=600000)
    grpc_server_handshake_timeout_ms: Ms = _key("grpc.server.handshake.timeout.ms", default=10000)
    grpc_max_connection_age_ms: NonNegative = _key("grpc.max.connection.age.ms", default=0)
    grpc_keepalive_time_ms: Ms = _key("grpc.keepalive.time.ms", default=60000)
    grpc_keepalive_timeout_ms: Ms = _key("grpc.keepalive.timeout.ms", default=20000)
    grpc_max_concurrent_streams: Positive = _key("grpc.max.concurrent.streams", default=1000)
    # Per-request work limits, checked before any work (POLICY_VIOLATION): CreateTopics, DeleteTopics and
    # ElectLeaders name at most this many topics / partitions.
    max_request_topics: Positive = _key("max.request.topics", default=10000)
    max_request_partitions: Positive = _key("max.request.partitions", default=200000)
    # Long-polls: MetadataFetch max_wait_ms is capped at this; at most fetch.max.parked.requests Fetch /
    # MetadataFetch requests wait at once per server (the rest are answered at once).
    metadata_fetch_max_wait_ms: NonNegative = _key("metadata.fetch.max.wait.ms", default=10000)
    fetch_max_parked_requests: Positive = _key(
        "fetch.max.parked.requests", default=DEFAULT_MAX_PARKED_FETCHES
    )

    @model_validator(mode="before")
    @classmethod
    def _resolve_metadata_log_dir(cls, data: Any) -> Any:
        """``metadata.log.dir`` defaults to the first of ``log.dirs`` (Kafka's rule)."""
        if not isinstance(data, dict):
            return data
        for meta_key in ("metadata.log.dir", "metadata_log_dir"):
            if _parse_optional_path(data.get(meta_key)) is not None:
                return data
        for dirs_key in ("log.dirs", "log_dirs"):
            if dirs_key in data:
                try:
                    dirs = _parse_paths(data[dirs_key])
                except (TypeError, ValueError):
                    return data  # the field validator reports it
                if dirs:
                    return {**data, "metadata.log.dir": dirs[0]}
        return data

    @model_validator(mode="after")
    def _check_combination(self) -> NodeConfig:
        _check_cross_field_rules(self)
        return self

    # --- derived views ---

    @property
    def roles(self) -> frozenset[Role]:
        return self.process_roles

    @property
    def is_controller(self) -> bool:
        return Role.CONTROLLER in self.process_roles

    @property
    def is_broker(self) -> bool:
        return Role.BROKER in self.process_roles

    @property
    def voters(self) -> tuple[Voter, ...]:
        return self.controller_quorum_voters

    @property
    def dynamic_quorum(self) -> bool:
        """No static ``controller.quorum.voters``: the voter set lives in the metadata log (KIP-853) and
        the quorum is found through ``controller.quorum.bootstrap.servers``."""
        return not self.controller_quorum_voters

    @property
    def controller_addresses(self) -> tuple[tuple[int, str], ...]:
        """(node id, ``host:port``) of the controllers a client dials first: the static voters, or the
        bootstrap servers under pseudo ids (:func:`bootstrap_server_id`)."""
        if self.controller_quorum_voters:
            return tuple((v.id, v.target) for v in self.controller_quorum_voters)
        return tuple(
            (bootstrap_server_id(i), target)
            for i, target in enumerate(self.controller_quorum_bootstrap_servers)
        )

    @property
    def voter_ids(self) -> frozenset[int]:
        return frozenset(v.id for v in self.controller_quorum_voters)

    def voter(self, node_id: int) -> Voter | None:
        return next((v for v in self.controller_quorum_voters if v.id == node_id), None)

    def listener(self, name: str) -> Listener | None:
        return next((lst for lst in self.listeners if lst.name == name.upper()), None)

    def advertised(self, listener: Listener) -> Listener:
        """The address registered for ``listener``: its ``advertised.listeners`` entry, else itself."""
        return next((a for a in self.advertised_listeners if a.name == listener.name), listener)

    @property
    def controller_listener(self) -> Listener | None:
        """The listener named first in ``controller.listener.names`` (None on a broker-only node)."""
        return self.listener(self.controller_listener_names[0])

    @property
    def broker_listener(self) -> Listener | None:
        """The first listener that is not a controller listener (None on a controller-only node)."""
        return next((lst for lst in self.listeners if lst.name not in self.controller_listener_names), None)

    def security_protocol(self, listener_name: str) -> str:
        """PLAINTEXT or SSL for a listener name (served here or dialled, e.g. CONTROLLER on a broker):
        its ``listener.security.protocol.map`` entry; unlisted names are PLAINTEXT, ``SSL`` is SSL."""
        name = listener_name.upper()
        for mapping in self.listener_security_protocol_map:
            if mapping.name == name:
                return mapping.protocol
        return "SSL" if name == "SSL" else "PLAINTEXT"

    @property
    def uses_ssl(self) -> bool:
        """Whether any listener this node serves or dials (the controller listeners) is SSL."""
        names = {lst.name for lst in self.listeners} | set(self.controller_listener_names)
        return any(self.security_protocol(name) == "SSL" for name in names)

    @property
    def authorizer_settings(self) -> AuthorizerSettings:
        return AuthorizerSettings(
            enabled=bool(self.authorizer_class_name),
            super_users=self.super_users,
            allow_everyone_if_no_acl_found=self.allow_everyone_if_no_acl_found,
        )

    @property
    def metrics_bind_host(self) -> str:
        """Where the Prometheus endpoint listens: ``metrics.host``, else the host of this node's first
        listener (all interfaces only when that listener is on all interfaces)."""
        if self.metrics_host is not None:
            return self.metrics_host
        first = self.controller_listener or self.broker_listener
        return first.host if first is not None and first.host else "0.0.0.0"

    @property
    def all_log_dirs(self) -> tuple[Path, ...]:
        """Every directory ``kraft storage format`` writes meta.properties into (no duplicates)."""
        dirs = list(self.log_dirs)
        if self.metadata_log_dir is not None and self.metadata_log_dir not in dirs:
            dirs.append(self.metadata_log_dir)
        return tuple(dirs)

    # --- construction and serialisation ---

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> NodeConfig:
        """Validate a key → string mapping; raises :class:`ConfigError` (one line) on the first problem."""
        for key, value in properties.items():
            if key not in _FIELD_BY_KEY:
                close = difflib.get_close_matches(key, _FIELD_BY_KEY, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError.for_key(key, value, f"unknown configuration key{hint}")
        try:
            return cls.model_validate(dict(properties))
        except ValidationError as exc:
            raise _config_error_from(exc, properties) from None

    @classmethod
    def build(cls, **fields: Any) -> NodeConfig:
        """Build from Python values by attribute name, with the same one-line :class:`ConfigError`."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise _config_error_from(exc, {_KEY_BY_FIELD.get(k, k): v for k, v in fields.items()}) from None

    def to_properties_dict(self, *, include_defaults: bool = False) -> dict[str, str]:
        """Kafka key → string value; defaults are left out unless asked for (None values always are)."""
        out: dict[str, str] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None or (value == () and name in _EMPTY_MEANS_UNSET):
                continue
            if not include_defaults and name not in self.model_fields_set and name != "metadata_log_dir":
                continue
            out[field.alias or name] = ";".join(sorted(value)) if name == "super_users" else _render(value)
        return out

    def to_properties(self, *, header: str | None = None, include_defaults: bool = False) -> str:
        """The ``.properties`` text of this config; ``load_config`` of it gives an equal config."""
        return format_properties(self.to_properties_dict(include_defaults=include_defaults), header)


_EMPTY_MEANS_UNSET: Final = frozenset({"controller_quorum_voters", "controller_quorum_bootstrap_servers"})
"""Keys whose empty default is "not set" (one of the two is required): an empty value is refused."""


def _render(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, frozenset):
        return ",".join(sorted(str(v) for v in value))
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


_FIELD_BY_KEY: Final[dict[str, str]] = {
    (field.alias or name): name for name, field in NodeConfig.model_fields.items()
}
_KEY_BY_FIELD: Final[dict[str, str]] = {name: key for key, name in _FIELD_BY_KEY.items()}


def _config_error_from(exc: ValidationError, given: Mapping[str, object]) -> ConfigError:
    first = exc.errors()[0]
    loc = first["loc"]
    key = str(loc[0]) if loc else "?"
    key = _KEY_BY_FIELD.get(key, key)
    more = exc.error_count() - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    if first["type"] == "missing":
        return ConfigError(f"missing required config key {key}{suffix}", key=key)
    rule = str(first["msg"]).removeprefix("Value error, ")
    value = given.get(key, first.get("input"))
    return ConfigError(ConfigError.for_key(key, value, rule).message + suffix, key=key, value=str(value))


def _check_cross_field_rules(cfg: NodeConfig) -> None:
    """Rules spanning several keys, in the spirit of Kafka's KafkaConfig validation."""
    roles_text = _render(cfg.process_roles)
    controller_names = set(cfg.controller_listener_names)
    listener_names = {lst.name for lst in cfg.listeners}
    if cfg.controller_quorum_voters and cfg.controller_quorum_bootstrap_servers:
        raise ConfigError.for_key(
            "controller.quorum.bootstrap.servers",
            ",".join(cfg.controller_quorum_bootstrap_servers),
            "set either controller.quorum.voters (a static quorum) or controller.quorum.bootstrap.servers "
            "(a dynamic one, KIP-853), not both",
        )
    if not cfg.controller_quorum_voters and not cfg.controller_quorum_bootstrap_servers:
        raise ConfigError(
            "missing required config key controller.quorum.voters "
            "(or controller.quorum.bootstrap.servers for a dynamic quorum)",
            key="controller.quorum.voters",
        )
    if cfg.is_controller:
        if cfg.controller_quorum_voters and cfg.node_id not in cfg.voter_ids:
            raise ConfigError.for_key(
                "node.id",
                str(cfg.node_id),
                f"a controller's node.id must be one of the voter ids in controller.quorum.voters "
                f"({','.join(str(i) for i in sorted(cfg.voter_ids))})",
            )
        if cfg.controller_listener is None:
            raise ConfigError.for_key(
                "listeners",
                _render(cfg.listeners),
                f"a controller needs a listener named {cfg.controller_listener_names[0]} "
                "(the first of controller.listener.names)",
            )
        if cfg.metadata_log_dir is None:
            raise ConfigError.for_key(
                "metadata.log.dir", "", "a controller needs metadata.log.dir or log.dirs"
            )
    if cfg.is_broker:
        if not cfg.log_dirs:
            raise ConfigError.for_key("log.dirs", "", "a broker needs at least one log directory")
        if cfg.broker_listener is None:
            raise ConfigError.for_key(
                "listeners",
                _render(cfg.listeners),
                "a broker needs a listener that is not in controller.listener.names (e.g. PLAINTEXT://…)",
            )
        if not cfg.is_controller and cfg.node_id in cfg.voter_ids:
            raise ConfigError.for_key(
                "node.id",
                str(cfg.node_id),
                "a broker-only node must not use a voter id from controller.quorum.voters "
                "(only a combined broker,controller node may)",
            )
        if cfg.message_max_bytes > cfg.grpc_max_message_bytes - GRPC_ENVELOPE_BYTES:
            raise ConfigError.for_key(
                "message.max.bytes",
                str(cfg.message_max_bytes),
                f"must be at most grpc.max.message.bytes ({cfg.grpc_max_message_bytes}) minus "
                f"{GRPC_ENVELOPE_BYTES} bytes for the request envelope, so that every accepted batch can be "
                "produced and fetched",
            )
        if cfg.replica_fetch_wait_max_ms >= cfg.replica_lag_time_max_ms:
            raise ConfigError.for_key(
                "replica.fetch.wait.max.ms",
                str(cfg.replica_fetch_wait_max_ms),
                f"must be less than replica.lag.time.max.ms ({cfg.replica_lag_time_max_ms}), or a follower "
                "parked at its leader would leave the ISR",
            )
        if cfg.replica_fetch_wait_max_ms >= cfg.replica_socket_timeout_ms:
            raise ConfigError.for_key(
                "replica.fetch.wait.max.ms",
                str(cfg.replica_fetch_wait_max_ms),
                f"must be less than replica.socket.timeout.ms ({cfg.replica_socket_timeout_ms})",
            )
        if cfg.broker_heartbeat_interval_ms >= cfg.broker_session_timeout_ms:
            raise ConfigError.for_key(
                "broker.heartbeat.interval.ms",
                str(cfg.broker_heartbeat_interval_ms),
                f"must be less than broker.session.timeout.ms ({cfg.broker_session_timeout_ms})",
            )
    _check_ssl_rules(cfg)
    # A controller of a dynamic quorum may advertise its CONTROLLER listener too (Kafka 3.9, KIP-853): that
    # address goes into the VotersRecord (add-controller, UpdateRaftVoter) and the other voters dial it.
    dynamic_controller = cfg.is_controller and not cfg.controller_quorum_voters
    advertisable = (listener_names - controller_names) | (
        listener_names & controller_names if dynamic_controller else set()
    )
    for advertised in cfg.advertised_listeners:
        if advertised.name not in advertisable or not advertised.host:
            raise ConfigError.for_key(
                "advertised.listeners",
                _render(cfg.advertised_listeners),
                f"{advertised.name} must name a listener of 'listeners' "
                f"({','.join(sorted(advertisable)) or 'none'}) with a host (a controller listener only "
                "on a controller of a dynamic quorum)",
            )
    if not cfg.is_controller and listener_names & controller_names:
        raise ConfigError.for_key(
            "listeners",
            _render(cfg.listeners),
            f"process.roles={roles_text} must not listen on controller listener "
            f"{','.join(sorted(listener_names & controller_names))}",
        )
    extra_names = ",".join(sorted(listener_names - controller_names))
    if not cfg.is_broker and extra_names:
        raise ConfigError.for_key(
            "listeners",
            _render(cfg.listeners),
            f"process.roles={roles_text} may only have controller listeners "
            f"({','.join(cfg.controller_listener_names)}), found {extra_names}",
        )


def _check_ssl_rules(cfg: NodeConfig) -> None:
    """Kafka's keystore/truststore key rules, and what SSL needs here (docs/security.md)."""
    if cfg.ssl_keystore_location is not None and (
        cfg.ssl_keystore_certificate_chain is not None or cfg.ssl_keystore_key is not None
    ):
        raise ConfigError.for_key(
            "ssl.keystore.location",
            str(cfg.ssl_keystore_location),
            "give ssl.keystore.location or ssl.keystore.certificate.chain with ssl.keystore.key, not both",
        )
    if (cfg.ssl_keystore_certificate_chain is None) != (cfg.ssl_keystore_key is None):
        missing = "ssl.keystore.key" if cfg.ssl_keystore_key is None else "ssl.keystore.certificate.chain"
        raise ConfigError(
            f"missing required config key {missing} (an inline PEM keystore needs both)", key=missing
        )
    if cfg.ssl_truststore_location is not None and cfg.ssl_truststore_certificates is not None:
        raise ConfigError.for_key(
            "ssl.truststore.location",
            str(cfg.ssl_truststore_location),
            "give ssl.truststore.location or ssl.truststore.certificates, not both",
        )
    if not cfg.uses_ssl:
        return
    ssl_names = ",".join(m.name for m in cfg.listener_security_protocol_map if m.protocol == "SSL") or "SSL"
    if cfg.ssl_keystore_location is None and cfg.ssl_keystore_key is None:
        raise ConfigError(
            f"missing required config key ssl.keystore.location (or ssl.keystore.key with "
            f"ssl.keystore.certificate.chain): listeners {ssl_names} are SSL",
            key="ssl.keystore.location",
        )
    if cfg.ssl_truststore_location is None and cfg.ssl_truststore_certificates is None:
        raise ConfigError(
            f"missing required config key ssl.truststore.location (or ssl.truststore.certificates): "
            f"listeners {ssl_names} are SSL",
            key="ssl.truststore.location",
        )
    controller = cfg.controller_listener_names[0]
    if cfg.is_controller and cfg.security_protocol(controller) == "SSL" and cfg.ssl_client_auth != "required":
        raise ConfigError.for_key(
            "ssl.client.auth",
            cfg.ssl_client_auth,
            f"the SSL controller listener {controller} needs ssl.client.auth=required "
            "(Raft peers prove their node id with their certificates)",
        )


def load_config(path: str | Path) -> NodeConfig:
    """Read and validate a ``.properties`` file; any problem is one-line :class:`ConfigError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    return NodeConfig.from_properties(parse_properties(text))
