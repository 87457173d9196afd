"""A Toxiproxy-API-compatible TCP proxy (asyncio, stdlib only).

``ToxiproxyServer`` runs in the caller's event loop; ``BackgroundProxyServer`` runs one in a thread for
synchronous users such as the ``toxiproxy`` client.  The HTTP contract is Toxiproxy 2.12.0's.
"""

from chaos.proxy.server import BackgroundProxyServer, ToxiproxyServer
from chaos.proxy.toxics import TOXIC_ATTRIBUTES, ApiError, Direction, Toxic

__all__ = ["TOXIC_ATTRIBUTES", "ApiError", "BackgroundProxyServer", "Direction", "Toxic", "ToxiproxyServer"]
