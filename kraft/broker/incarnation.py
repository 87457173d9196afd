"""The broker's incarnation file: which processes ran this broker on these log dirs.

A broker killed with SIGKILL leaves its registration behind with a live session, and the controller
refuses a new incarnation (DUPLICATE_BROKER_REGISTRATION) until that session expires — 9 s by default,
while the restarted process could serve after a second (issue #19: register ≤ 2 s after kill -9).  And
KIP-966's eligible leader replicas need to know whether a new incarnation runs on the log dirs of the
registered one: one that cannot prove it leaves every ELR, as after an unclean shutdown
(docs/internals/replication.md).

A new process can prove both: it holds the exclusive locks of the broker's log dirs
(:class:`kraft.storage.dir_lock.DirectoryLocks`, released by the kernel when a process dies), and every
earlier process, while it held them, stored its incarnation id in :data:`INCARNATION_FILE`.  So the new
process reads the file *after* taking the locks and sends what it read with RegisterBroker; the
controller accepts it at once (and keeps it in every ELR) when the registered incarnation is among them.

The file holds a provenance chain, not just one id, because a process can die before its registration
reached the controller: i2 takes over from i1 (the registered one) and crashes unregistered, then i3
takes over from i2 — on the same log dirs, yet with only "i2" as proof the controller, still holding
i1, would judge it unclean.  So the file lists, newest first, the process that wrote it and then every
process before it since the last one the controller is known to have accepted:

- :func:`take_over_incarnation` (at startup, under the locks) reads the stored ids — its predecessors,
  sent as ``previous_incarnation_id`` (the newest) and ``earlier_incarnation_ids`` — and durably stores
  ``[own id] + predecessors``;
- :func:`accept_incarnation` (once a RegisterBroker answer accepted this process) durably rewrites the
  file with just its own id: the controller holds it now, so nothing older is needed.  A crash before
  that rewrite keeps the chain, which is still true.

The chain is bounded (:data:`MAX_PREDECESSORS`, oldest ids dropped): that many crashes in a row, each
before its registration was answered, are needed to drop the registered incarnation, and then the
request merely fails to name it — the session rule and an unclean re-registration apply, the safe
side.  Every id the file holds did run on these log dirs, so a longer or shorter chain can never make
a registration from other dirs look clean.  No file, or a damaged one (any line that is not a UUID),
gives no predecessors at all: no proof, the session rule applies, as Kafka does.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from kraft.storage.fileio import atomic_write

INCARNATION_FILE = "broker.incarnation"
MAX_PREDECESSORS = 16
"""Predecessor ids kept (and sent) at most: ``previous_incarnation_id`` plus up to 15
``earlier_incarnation_ids``.  The controller accepts up to
:data:`kraft.metadata.request_limits.MAX_EARLIER_INCARNATION_IDS` earlier ids (more than this)."""


def read_incarnations(directory: Path) -> tuple[str, ...]:
    """The ids stored in ``directory``'s incarnation file, newest first (at most
    :data:`MAX_PREDECESSORS`); empty when there is none or it is damaged."""
    try:
        lines = (directory / INCARNATION_FILE).read_text(encoding="ascii").split()
        ids = tuple(str(uuid.UUID(line)) for line in lines)
    except (OSError, ValueError):  # none yet, or damaged: no proof, so the session rule applies
        return ()
    return ids[:MAX_PREDECESSORS]


def take_over_incarnation(directory: Path, incarnation_id: str) -> tuple[str, ...]:
    """Return the predecessors stored in ``directory`` (newest first; empty when none or unreadable)
    and durably store ``incarnation_id`` followed by them.  Call only while holding the broker's
    directory locks."""
    predecessors = read_incarnations(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / INCARNATION_FILE, _encode((incarnation_id, *predecessors)))
    return predecessors


def accept_incarnation(directory: Path, incarnation_id: str) -> None:
    """The controller accepted ``incarnation_id``'s registration: durably forget its predecessors.
    Call only while holding the broker's directory locks (blocking: an fsync'd small write)."""
    atomic_write(directory / INCARNATION_FILE, _encode((incarnation_id,)))


def _encode(ids: tuple[str, ...]) -> bytes:
    return "".join(f"{i}\n" for i in ids).encode("ascii")
