"""``kraft demo``: start a local cluster and walk through topics, produce/consume and the quorum tools."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kraft.cli.common import CliError, handle_errors
from kraft.cluster.demo import DEFAULT_DEMO_DIR, Demo, DemoError


@handle_errors
def demo_command(
    directory: Annotated[
        Path, typer.Option("--dir", "-d", help="Where the demo cluster lives (configs, data, logs).")
    ] = DEFAULT_DEMO_DIR,
    brokers: Annotated[int, typer.Option("--brokers", min=1, max=9, help="Brokers to start.")] = 3,
    tls: Annotated[
        bool, typer.Option("--tls", help="A new cluster runs mutual TLS (cluster up --tls).")
    ] = False,
) -> None:
    """Start a local demo cluster and walk through topics, produce/consume and the quorum tools.

    Steps: `cluster up`, create a topic, produce and consume records,
    describe the quorum and the brokers; each step is the real `kraft`
    command, printed before its output.

    Safe to run again: a running demo cluster is re-used, a stopped one
    restarted.  The cluster keeps running afterwards; stop it with
    `kraft cluster down --dir DIR`.

    Examples:

      kraft demo

      kraft demo --dir /tmp/kraft-demo --brokers 1

      kraft demo --dir /tmp/kraft-tls-demo --tls
    """
    try:
        Demo(directory, brokers, tls=tls).run()
    except DemoError as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        # Ctrl-C reaches the running step too (same process group); `cluster up` stops what it started.
        raise CliError(
            f"interrupted; see `kraft cluster status --dir {directory}`, stop it with "
            f"`kraft cluster down --dir {directory}`"
        ) from None
