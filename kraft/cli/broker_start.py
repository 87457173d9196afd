"""``kraft broker start --config F``: run a broker in the foreground until SIGTERM/SIGINT.

Adds the ``start`` command to the ``kraft broker`` group (``kraft.cli.broker.app``).  Startup checks
every log dir's ``meta.properties`` (formatted for this node, one cluster id); the applied metadata image
lives in ``<metadata.log.dir>/metadata-image.sqlite``.  SIGTERM runs a controlled shutdown; exit 0 after a
clean stop, 1 with one ``error:`` line when the broker cannot start or register.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from kraft.broker.lifecycle import RegistrationFailed
from kraft.broker.open_files import raise_open_file_limit
from kraft.broker.server import BrokerServer, BrokerSettings
from kraft.cli.broker import app
from kraft.cli.common import CliError, ConfigOption, handle_errors
from kraft.config import NodeConfig, load_config
from kraft.metadata.store import ImageStore
from kraft.observability.logging import configure_logging
from kraft.runtime import RuntimeChoiceError, check_choices, run_server
from kraft.storage.meta_properties import check_meta_properties

IMAGE_STORE_FILE = "metadata-image.sqlite"
# A combined node (process.roles=broker,controller) runs a controller process on the same metadata dir,
# whose image store already uses IMAGE_STORE_FILE: the broker must not share that file.
COMBINED_IMAGE_STORE_FILE = "broker-metadata-image.sqlite"


def image_store_path(config: NodeConfig) -> Path:
    """Where the broker keeps its image store (the name `kraft metadata shell --config` looks for)."""
    base = config.metadata_log_dir or config.log_dirs[0]
    return Path(base) / (COMBINED_IMAGE_STORE_FILE if config.is_controller else IMAGE_STORE_FILE)


def cluster_id_of(config: NodeConfig) -> str:
    """The cluster id every log dir was formatted with (they must agree and name this node)."""
    ids = {str(d): check_meta_properties(d, node_id=config.node_id).cluster_id for d in config.all_log_dirs}
    if len(set(ids.values())) != 1:
        listing = ", ".join(f"{d}={c}" for d, c in sorted(ids.items()))
        raise CliError(f"log dirs belong to different clusters: {listing}")
    return next(iter(ids.values()))


@app.command("start")
@handle_errors
def start(config: ConfigOption) -> None:
    """Run a broker in the foreground (SIGTERM = controlled shutdown).

    Needs formatted storage; exits 1 if it cannot register with the active
    controller within initial.broker.registration.timeout.ms.

    Examples:

      kraft broker start --config broker-101.properties

      kraft broker start -c config/broker-101.properties 2>b101.log &
    """
    try:
        check_choices()
    except RuntimeChoiceError as err:
        raise CliError(str(err)) from None
    cfg = load_config(config)
    if not cfg.is_broker:
        raise CliError(f"{config}: process.roles must include broker to run `kraft broker start`")
    configure_logging(cfg.log_level)
    raise_open_file_limit()  # before any partition log is opened
    cluster_id = cluster_id_of(cfg)
    try:
        run_server(_run(cfg, cluster_id))
    except RegistrationFailed as err:
        raise CliError(f"broker {cfg.node_id}: {err}") from err
    except RuntimeChoiceError as err:
        raise CliError(str(err)) from None


async def _run(cfg: NodeConfig, cluster_id: str) -> None:
    store = await ImageStore.open(image_store_path(cfg))
    server = BrokerServer(BrokerSettings.from_config(cfg, cluster_id), store)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.run(stop)
