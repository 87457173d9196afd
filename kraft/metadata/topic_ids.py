"""Random topic ids (version-4 UUID strings) drawn from the OS's CSPRNG a pool at a time.

``str(uuid.uuid4())`` per topic calls ``os.urandom(16)``: a ``getrandom`` syscall for which CPython
drops the GIL, on the active controller's event loop in the middle of a CreateTopics event — a hand-off
to the intake thread whenever it is runnable, and ~3 µs with the UUID object and its formatting
(issue #17, the leader's side of a lone write).  :class:`TopicIds` reads ``POOL_IDS`` ids' worth of
bytes from ``os.urandom`` at once and formats each id from its 16 bytes.

The ids are exactly as random as ``uuid4``'s: the same source (the kernel's CSPRNG), 122 random bits
each, the version and variant bits set as :class:`uuid.UUID` sets them (Kafka's ``Uuid.randomUuid``
draws from ``SecureRandom`` as well).  Only the syscall is shared: bytes for the next ids sit in
process memory until used — no weaker than the ids themselves, which every client may read.  A
seeded ``random.Random`` (Mersenne Twister) was not used: its state is recoverable from 624 outputs,
so anyone who lists topics could predict the next ids.  A forked child drops the bytes it inherited
(``os.register_at_fork``): parent and child would otherwise hand out the same ids.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

POOL_IDS = 256
"""Ids per ``os.urandom`` call (4 KiB: one syscall per 256 topics created)."""

_ID_BYTES = 16
# uuid.UUID(version=4): variant bits (RFC 4122) and version bits over the 128-bit integer
_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_SET = (0x8000 << 48) | (4 << 76)

_live: weakref.WeakSet[TopicIds] = weakref.WeakSet()


def _drop_inherited_pools() -> None:
    for ids in list(_live):
        ids.drop_pool()


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_drop_inherited_pools)


def format_uuid4(raw: bytes) -> str:
    """``str(uuid.UUID(bytes=raw, version=4))`` for 16 bytes, without the UUID object."""
    value = (int.from_bytes(raw, "big") & _CLEAR) | _SET
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class TopicIds:
    """A callable giving a new random topic id (a version-4 UUID string) per call."""

    __slots__ = ("__weakref__", "_pool", "_position", "_random_bytes")

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        """``random_bytes``: the source (``os.urandom``; a test passes its own)."""
        self._random_bytes = random_bytes
        self._pool = b""
        self._position = 0
        _live.add(self)

    def drop_pool(self) -> None:
        """Forget the bytes not used yet (the next call draws a fresh pool)."""
        self._pool = b""
        self._position = 0

    def __call__(self) -> str:
        position = self._position
        if position + _ID_BYTES > len(self._pool):
            self._pool = self._random_bytes(_ID_BYTES * POOL_IDS)
            position = 0
        self._position = position + _ID_BYTES
        return format_uuid4(self._pool[position : position + _ID_BYTES])
