"""Which address of a client's list to ask next: ONE rule for every client that picks among addresses
(the controller client's voters, ``describe_quorum``'s and the voter changes' bootstrap controllers, the
broker client's Metadata candidates), so the CLI's commands all behave alike.

The rule, after Kafka's ``NetworkClient.leastLoadedNode``: start at ``first`` (the CLI draws it at random,
as Kafka starts at a random offset, so a dead first address does not cost every command one request
timeout) and go round the list, skipping an address whose last attempt failed in transport (refused,
black-holed, no such service) while one whose last attempt did not fail is left; an address that answers
is forgotten as failed; when every address has failed, the marks are forgotten and the rotation starts
over (a node may be back).

Kafka blacks a failed node out for ``reconnect.backoff.ms`` (growing to ``reconnect.backoff.max.ms``, 1 s)
and then asks it again.  Here a mark lasts until the node answers or every node has failed: a black-holed
address costs a request timeout per attempt (a hung process accepts the connection, so gRPC's own
reconnect backoff never sees it fail), and asking it again every second would cost one request timeout
per second of a command that lives only for its ``--timeout``.  Connection attempts themselves are paced
by the channels' reconnect backoff (:mod:`kraft.client.controller`).

Last resorts: a list may name some of its addresses as asked only when every other one has failed — the
controller client's configured bootstrap servers once it knows the voter set (Kafka's observers use
``controller.quorum.bootstrap.servers`` only while they know no leader).

No IO, no clock: the callers decide when to ask again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

UNREACHABLE_TIMEOUT_S = 3.0
"""How long every address of a command's list may fail in transport (nothing answers at all) before the
CLI's clients give up with "no … reachable at …; is --bootstrap-… right?" instead of retrying to the
command's deadline: a node that restarts is back within this; a mistyped address never is."""


class NodeRotation(Generic[T]):
    """A rotation over ``nodes`` (each named by ``key(node)``, its address) that remembers failures."""

    def __init__(self, nodes: Sequence[T], key: Callable[[T], str], *, first: int = 0) -> None:
        if not nodes:
            raise ValueError("a rotation needs at least one node")
        self._nodes = list(nodes)
        self._key = key
        self._next = first % len(self._nodes)
        self._failed: set[str] = set()
        self._last_resort: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def nodes(self) -> list[T]:
        return list(self._nodes)

    def is_failed(self, address: str) -> bool:
        return address in self._failed

    def failed(self, address: str) -> None:
        """``address``'s attempt failed in transport: not asked again while another has not failed."""
        self._failed.add(address)

    def answered(self, address: str) -> None:
        """``address`` answered (whatever it said): it is asked again in its turn."""
        self._failed.discard(address)

    def next(self, avoid: str | None = None) -> T | None:
        """The next node in the rotation other than ``avoid`` whose last attempt did not fail; when every
        such node has failed, the marks are forgotten and the next one other than ``avoid`` is taken.
        None only when ``avoid`` is the only node.  Advances the rotation."""
        if self._failed and all(self._key(n) in self._failed or self._key(n) == avoid for n in self._nodes):
            self._failed.clear()  # all failed: start over (a node may be back)
        count = len(self._nodes)
        # A last resort is taken only when no other node is left: a second pass when there are any.
        for skip_last_resorts in (True, False) if self._last_resort else (False,):
            for step in range(count):
                index = (self._next + step) % count
                address = self._key(self._nodes[index])
                if address == avoid or address in self._failed:
                    continue
                if skip_last_resorts and address in self._last_resort:
                    continue
                self._next = index + 1
                return self._nodes[index]
        return None

    def replace(self, nodes: Sequence[T], *, last_resort: Iterable[str] = ()) -> None:
        """A new list (a client that learned its cluster's nodes): the marks of addresses still in it
        are kept; the rotation starts at the new list's first node.  ``last_resort``: addresses asked only
        when every other node's last attempt failed."""
        if not nodes:
            raise ValueError("a rotation needs at least one node")
        self._nodes = list(nodes)
        self._next = 0
        keys = {self._key(n) for n in self._nodes}
        self._failed &= keys
        self._last_resort = frozenset(last_resort) & keys

    def round(self) -> list[T]:
        """One pass for a caller that asks its nodes in turn until one serves it: every node whose last
        attempt did not fail, in rotation order from the next one (the rotation does not advance: a node
        that serves is asked first again; last resorts after the others); when every node has failed,
        every node (marks forgotten)."""
        if all(self._key(n) in self._failed for n in self._nodes):
            self._failed.clear()
        start = self._next % len(self._nodes)
        ordered = self._nodes[start:] + self._nodes[:start]
        ordered = [n for n in ordered if self._key(n) not in self._failed]
        return sorted(ordered, key=lambda n: self._key(n) in self._last_resort)  # stable: last resorts last


def address_rotation(addresses: Sequence[str], *, first: int = 0) -> NodeRotation[str]:
    """A :class:`NodeRotation` over plain ``host:port`` addresses."""
    return NodeRotation(addresses, _itself, first=first)


def _itself(address: str) -> str:
    return address
