"""The broker's incarnation file: which process last ran this broker on these log dirs.

A broker killed with SIGKILL leaves its registration behind with a live session, and the controller
refuses a new incarnation (DUPLICATE_BROKER_REGISTRATION) until that session expires — 9 s by default,
while the restarted process could serve after a second (issue #19: register ≤ 2 s after kill -9).

A new process can prove the old one is gone: it holds the exclusive locks of the broker's log dirs
(:class:`kraft.storage.dir_lock.DirectoryLocks`, released by the kernel when a process dies), and the old
process, while it held them, stored its incarnation id in :data:`INCARNATION_FILE`.  So the new process
reads that id *after* taking the locks, sends it as RegisterBroker's ``previous_incarnation_id``, and then
stores its own.  The controller accepts a new incarnation at once when the request names the registered
one as its predecessor; anything else (another host's broker with the same id, no file, a damaged file)
still waits for the session, as Kafka does.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from kraft.storage.fileio import atomic_write

INCARNATION_FILE = "broker.incarnation"


def take_over_incarnation(directory: Path, incarnation_id: str) -> str:
    """Return the incarnation id stored in ``directory`` ("" when none or unreadable) and durably store
    ``incarnation_id`` in its place.  Call only while holding the broker's directory locks."""
    path = directory / INCARNATION_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
        previous = str(uuid.UUID(text)) if text else ""
    except (OSError, ValueError):  # none yet, or damaged: no proof, so the session rule applies
        previous = ""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(path, f"{incarnation_id}\n".encode("ascii"))
    return previous
