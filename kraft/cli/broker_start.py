"""``kraft broker start --config F``: run a broker in the foreground until SIGTERM/SIGINT.

Adds the ``start`` command to the ``kraft broker`` group (``kraft.cli.broker.app``).  Startup checks
every log dir's ``meta.properties`` (formatted for this node, one cluster id); the applied metadata image
lives in ``<metadata.log.dir>/metadata-image.sqlite``.  SIGTERM runs a controlled shutdown; exit 0 after a
clean stop, 1 with one ``error:`` line when the broker cannot start or register.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

from kraft.cli.broker import app
from kraft.cli.common import CliError, ConfigOption, handle_errors
from kraft.config import load_config
from kraft.observability.logging import configure_logging
from kraft.runtime import RuntimeChoiceError, check_choices, run_server


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
    # Imported here, as in `kraft controller start`: the broker node (partitions, replication, storage,
    # TLS) is ~0.25 s of imports that `kraft broker list` and every other broker command do without.
    from kraft.broker.lifecycle import RegistrationFailed
    from kraft.broker.open_files import raise_open_file_limit
    from kraft.node.broker import BrokerStartupError, cluster_id_of, run_broker
    from kraft.security.tls import TlsError, check_node_tls

    try:
        check_choices()
    except RuntimeChoiceError as err:
        raise CliError(str(err)) from None
    cfg = load_config(config)
    if not cfg.is_broker:
        raise CliError(f"{config}: process.roles must include broker to run `kraft broker start`")
    configure_logging(cfg.log_level)
    try:
        check_node_tls(cfg)
    except TlsError as err:
        raise CliError(f"cannot use the TLS configuration: {err}") from None
    raise_open_file_limit()  # before any partition log is opened
    try:
        cluster_id = cluster_id_of(cfg)
    except BrokerStartupError as err:
        raise CliError(str(err)) from None
    try:
        run_server(run_broker(cfg, cluster_id))
    except BrokerStartupError as err:
        raise CliError(str(err)) from None
    except RegistrationFailed as err:
        raise CliError(f"broker {cfg.node_id}: {err}") from err
    except RuntimeChoiceError as err:
        raise CliError(str(err)) from None
    _exit_after_clean_stop()


def _exit_after_clean_stop() -> NoReturn:
    """End the process at once after a clean stop.  By now every partition log, checkpoint and the image
    store are closed and synced (``BrokerServer._shut_down``) and the event loop is closed; what is left is
    the interpreter tearing down the broker's objects, 0.2-0.5 s with 2,000 partitions — a quarter of the
    2 s stop budget (issue #19, bench/results/broker_stop.json).  Output is flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
