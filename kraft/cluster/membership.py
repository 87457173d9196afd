"""Adding a controller to a dynamic quorum (KIP-853) from the joining controller's own config.

One code path for ``kraft quorum add-controller --command-config controller.properties`` and ``kraft
cluster up --dynamic``: the joiner's node id, directory id (its ``meta.properties``), CONTROLLER endpoint
and, on TLS, its certificate (the leader takes voter changes only from a controller) all come from its
config; the leader adds it once it has caught up (AddRaftVoter waits for that, bounded by ``timeout_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kraft.client.channel import ChannelSecurity
from kraft.client.quorum import DEFAULT_PACING, ControllerEndpoint, Pacing, add_controller
from kraft.config import NodeConfig, load_config
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import advertised_host
from kraft.storage.meta_properties import read_meta_properties


@dataclass(frozen=True, slots=True)
class JoiningController:
    """What AddRaftVoter needs about a controller, read from its config and its metadata directory."""

    node_id: int
    directory_id: str
    endpoint: ControllerEndpoint
    security: ChannelSecurity
    """How to dial the quorum as this controller (its keystore on TLS)."""

    def describe(self) -> str:
        e = self.endpoint
        endpoint = f"{e.name}://{e.host}:{e.port}"
        return f"controller {self.node_id} with directory id {self.directory_id} and endpoint {endpoint}"


def joining_controller(config_path: Path) -> JoiningController:
    """Read a controller's config and ``meta.properties``; :class:`KraftError` (INVALID_REQUEST) when
    ``config_path`` is not a formatted controller's."""
    cfg = load_config(config_path)
    return joining_controller_of(cfg, config_path)


def joining_controller_of(cfg: NodeConfig, source: Path | str = "the config") -> JoiningController:
    listener = cfg.controller_listener
    if not cfg.is_controller or listener is None or cfg.metadata_log_dir is None:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"{source} is not a controller's config (process.roles, CONTROLLER listener)",
        )
    meta = read_meta_properties(cfg.metadata_log_dir)
    advertised = cfg.advertised(listener)  # advertised.listeners may name the CONTROLLER listener
    # Imported here: TLS pulls in cryptography, which `kraft --help` does not need.
    from kraft.security.tls import outbound_security

    return JoiningController(
        cfg.node_id,
        meta.directory_id,
        ControllerEndpoint(listener.name, advertised_host(advertised.host), advertised.port),
        outbound_security(cfg, listener.name),
    )


def add_joining_controller(
    bootstrap: Sequence[str],
    joiner: JoiningController,
    timeout_s: float = 30.0,
    on_retry: Callable[[str], None] | None = None,
    unreachable_timeout_s: float | None = None,
    pacing: Pacing = DEFAULT_PACING,
) -> int | None:
    """AddRaftVoter for ``joiner`` (running and fetching as an observer); waits until the leader has
    added it (it must catch up first) and the VotersRecord committed.  Returns that record's offset.
    ``on_retry``: one line per retry (``--verbose``); ``unreachable_timeout_s``: give up that early when
    no bootstrap address answers at all (:func:`kraft.client.quorum.describe_quorum`); ``pacing``: its
    attempts' limit and pauses (:class:`kraft.client.quorum.Pacing`)."""
    return add_controller(
        bootstrap,
        joiner.node_id,
        joiner.directory_id,
        [joiner.endpoint],
        timeout_s,
        joiner.security,
        on_retry=on_retry,
        unreachable_timeout_s=unreachable_timeout_s,
        pacing=pacing,
    )
