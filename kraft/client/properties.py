"""A client's ``.properties`` file — the CLI's ``--command-config``, a local cluster's ``client.properties``
(``--cluster-dir`` / ``KRAFT_CLUSTER_DIR``) — read by ONE parser, so every place that reads client
properties accepts the same keys with the same checks and the same one-line errors.

The keys are Kafka's admin client's, those kraft honours:

* ``security.protocol`` and the ``ssl.*`` keys (:data:`kraft.security.tls.CLIENT_KEYS`, checked by
  :func:`kraft.security.tls.client_security`): how channels are opened;
* ``request.timeout.ms``: one RPC of an admin command (the CLI's default 5000);
* ``default.api.timeout.ms``: a whole admin command, retries included, when ``--timeout`` is not given (the
  CLI's default 15000).  As in Kafka's admin client, an explicit value below the *effective*
  ``request.timeout.ms`` — the file's, else the client's default (the CLI's 5000) — is an error
  (``KafkaAdminClient`` throws a ``ConfigException`` for it when it is created, whatever timeout a call is
  later given): :func:`check_effective_timeouts`;
* ``retry.backoff.ms``: the pause before a retry (Kafka's default 100): the broker commands' metadata
  refreshes (``produce``, ``consume``, ``offsets``, ``log-dirs``) wait exactly this, the admin commands'
  rounds start at it and double up to 1 s (Kafka's ``retry.backoff.max.ms``), ``quorum`` commands wait it
  between DescribeQuorum rounds; 0 retries at once, as in Kafka;
* ``max.block.ms`` (Kafka's producer key, default 60000): how long ``kraft produce`` waits for a topic or
  partition its brokers' metadata does not know yet — a topic created a moment ago — before it fails with
  UNKNOWN_TOPIC_OR_PARTITION, never longer than its ``--timeout``; 0 fails at the first answer that does
  not know it, as Kafka's ``send()`` does.

Any other key is refused, naming the known ones: Kafka only warns about a key it does not use, but a key
kraft silently ignored (``retry.backoff.max.ms``, ``client.id``, ``sasl.*``) would look honoured when it is
not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kraft.client.channel import PLAINTEXT_SECURITY, ChannelSecurity
from kraft.config import ConfigError, parse_properties
from kraft.security.tls import CLIENT_KEYS, client_security

REQUEST_TIMEOUT_KEY = "request.timeout.ms"
DEFAULT_API_TIMEOUT_KEY = "default.api.timeout.ms"
RETRY_BACKOFF_KEY = "retry.backoff.ms"
MAX_BLOCK_KEY = "max.block.ms"
TIMEOUT_KEYS = frozenset({REQUEST_TIMEOUT_KEY, DEFAULT_API_TIMEOUT_KEY})
KNOWN_KEYS = CLIENT_KEYS | TIMEOUT_KEYS | {RETRY_BACKOFF_KEY, MAX_BLOCK_KEY}
MAX_MS = 2**31 - 1
"""Both timeouts are Kafka INT keys: a larger value is refused there (ConfigDef), and here it would pass
as an attempt limit of years.  ``retry.backoff.ms`` and ``max.block.ms`` are Kafka LONG keys; the same
bound keeps them below what an asyncio or gRPC deadline can hold (and no one waits 24 days on purpose)."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What one client properties file says; a timeout it does not set is None (the caller's default)."""

    security: ChannelSecurity = PLAINTEXT_SECURITY
    request_timeout_ms: int | None = None
    default_api_timeout_ms: int | None = None
    retry_backoff_ms: int | None = None
    max_block_ms: int | None = None


def parse_client_config(properties: Mapping[str, str], *, origin: str = "client config") -> ClientConfig:
    """``properties`` (one file's) → :class:`ClientConfig`; raises :class:`ConfigError` (one line, naming
    ``origin``) on an unknown key, a bad value or unreadable TLS material."""
    for name in properties:
        if name not in KNOWN_KEYS:
            raise ConfigError.for_key(
                name, properties[name], f"unknown key in {origin} (known: {', '.join(sorted(KNOWN_KEYS))})"
            )
    request_ms = _ms(properties, REQUEST_TIMEOUT_KEY, origin)
    api_ms = _ms(properties, DEFAULT_API_TIMEOUT_KEY, origin)
    # Kafka's ConfigDef: atLeast(0) for both — 0 is meaningful (retry at once; never block on metadata).
    backoff_ms = _ms(properties, RETRY_BACKOFF_KEY, origin, minimum=0)
    block_ms = _ms(properties, MAX_BLOCK_KEY, origin, minimum=0)
    check_effective_timeouts(ClientConfig(PLAINTEXT_SECURITY, request_ms, api_ms), None, origin=origin)
    security = client_security({k: v for k, v in properties.items() if k in CLIENT_KEYS}, origin=origin)
    return ClientConfig(security, request_ms, api_ms, backoff_ms, block_ms)


def check_effective_timeouts(
    config: ClientConfig, default_request_timeout_ms: int | None, *, origin: str = "client config"
) -> None:
    """Kafka's rule (``KafkaAdminClient.configureDefaultApiTimeoutMs``): an explicit
    ``default.api.timeout.ms`` below the effective ``request.timeout.ms`` — the file's, else
    ``default_request_timeout_ms`` (None: no default known, only a file that sets both is checked) — is a
    one-line :class:`ConfigError`.  An unset ``default.api.timeout.ms`` is never an error: its default is
    raised to the request timeout instead (the CLI's ``api_timeout_s``, as Kafka does)."""
    api_ms = config.default_api_timeout_ms
    request_ms = config.request_timeout_ms
    effective = request_ms if request_ms is not None else default_request_timeout_ms
    if api_ms is None or effective is None or api_ms >= effective:
        return
    which = f"{effective}" if request_ms is not None else f"{effective}, its default"
    raise ConfigError.for_key(
        DEFAULT_API_TIMEOUT_KEY,
        str(api_ms),
        f"must be no smaller than {REQUEST_TIMEOUT_KEY} ({which}) in {origin}",
    )


def load_client_config(path: Path | str, *, what: str = "command config") -> ClientConfig:
    """Read and parse a client properties file (one-line :class:`ConfigError` on any problem, naming the
    file as ``what``: ``--command-config``'s, or a cluster directory's ``client properties``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_client_config(parse_properties(text), origin=str(path))


def _ms(properties: Mapping[str, str], key: str, origin: str, *, minimum: int = 1) -> int | None:
    """``key``'s whole number of ms in ``minimum``..:data:`MAX_MS` (None: not set); digits only, so
    ``inf``, ``nan``, ``-1`` and ``1e3`` are one-line errors."""
    value = properties.get(key)
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or not minimum <= int(text) <= MAX_MS:
        what = "a positive number" if minimum > 0 else "a number"
        raise ConfigError.for_key(key, value, f"must be {what} of ms up to {MAX_MS} (in {origin})")
    return int(text)
