"""A loopback TCP forwarder whose answers start late: the first bytes back to the client (the server's
HTTP/2 SETTINGS, for gRPC) wait ``delay_s``, as from a peer on a loaded host.  Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

BOUND_S = 30.0  # a pump stops by then whatever the test did


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    try:
        async with asyncio.timeout(BOUND_S):
            first = True
            while chunk := await reader.read(65536):
                if first and delay_s:
                    await asyncio.sleep(delay_s)
                first = False
                writer.write(chunk)
                await writer.drain()
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def slow_first_answer(port: int, delay_s: float) -> AsyncIterator[int]:
    """A port forwarding to ``127.0.0.1:port`` whose first answer on each connection waits ``delay_s``."""
    pumps: set[asyncio.Task[None]] = set()

    async def accept(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", port)
        for task in (
            asyncio.create_task(_pump(client_reader, server_writer, 0.0)),
            asyncio.create_task(_pump(server_reader, client_writer, delay_s)),
        ):
            pumps.add(task)
            task.add_done_callback(pumps.discard)

    forwarder = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield forwarder.sockets[0].getsockname()[1]
    finally:
        forwarder.close()
        for task in list(pumps):
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await forwarder.wait_closed()
