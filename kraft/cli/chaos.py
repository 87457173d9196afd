"""``kraft chaos proxy``: the Toxiproxy-compatible proxy server; ``kraft chaos run``: checked chaos runs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from chaos.proxy import ApiError, ToxiproxyServer
from kraft.cli.common import CliError, handle_errors

app = typer.Typer(no_args_is_help=True, help="Chaos testing: a Toxiproxy-compatible proxy and checked runs.")


async def _serve_proxy(host: str, port: int, seed: int | None, config: Path | None) -> None:
    server = ToxiproxyServer(host, port, seed)
    try:
        await server.start(config)
    except ApiError as exc:
        raise CliError(f"--config {config}: {exc.message}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sys.stderr.write(f"toxiproxy-compatible API listening on {server.url} (API version 2.12.0)\n")
    sys.stderr.flush()
    serving = asyncio.create_task(server.serve_forever())
    try:
        await stop.wait()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await server.stop()


@app.command("proxy")
@handle_errors
def proxy_command(
    host: Annotated[str, typer.Option("--host", help="Address the HTTP API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="HTTP API port.")] = 8474,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for toxicity draws and jitter.")] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", exists=True, dir_okay=False, help="JSON array of proxies to create first."),
    ] = None,
) -> None:
    """Run a Toxiproxy-API-compatible proxy server in the foreground (Ctrl-C or SIGTERM stops it)."""
    try:
        asyncio.run(_serve_proxy(host, port, seed, config))
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"--config {config}: not a JSON array of proxies: {exc}") from None
