"""``quorum-state``: the durable election state of a voter, JSON like Kafka's (data_version 1)::

    {"leaderId": 1, "leaderEpoch": 5, "votedId": -1, "votedDirectoryId": "…", "data_version": 1,
     "crc32c": 123456789}

-1 means "none" on disk, ``None`` in Python.  The file lives in the metadata log directory and is replaced
atomically (temp, fsync, rename, directory fsync) before the in-memory state changes.

Integrity (issue #14): ``crc32c`` (kraft's addition; Kafka's reader ignores unknown fields) is the CRC-32C
of the other fields as canonical JSON (sorted keys, no spaces), so a flipped digit in an epoch or a vote —
still valid JSON — is caught instead of believed.  A file without it (written by an older kraft, or by
Kafka) is accepted only when every key is a known one: a damaged key name cannot hide the checksum.
Whatever fails is a :class:`StorageStateError` naming the file; the file is never reset or rewritten.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from kraft.observability.logging import get_logger
from kraft.storage.errors import StorageStateError
from kraft.storage.fileio import atomic_write

QUORUM_STATE_FILE = "quorum-state"
DATA_VERSION = 1
CHECKSUM_KEY = "crc32c"
_KNOWN_KEYS = frozenset(
    # Kafka's QuorumStateData (data_version 0 also had currentVoters and appliedOffset).
    {
        "leaderId",
        "leaderEpoch",
        "votedId",
        "votedDirectoryId",
        "data_version",
        "currentVoters",
        "appliedOffset",
    }
)

_log = get_logger("storage")


def _checksum(body: dict[str, object]) -> int:
    """CRC-32C of ``body`` (without the checksum) as canonical JSON."""
    canonical = json.dumps(
        {k: v for k, v in body.items() if k != CHECKSUM_KEY}, sort_keys=True, separators=(",", ":")
    )
    return crc32c(canonical.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class QuorumState:
    leader_epoch: int
    leader_id: int | None = None
    voted_id: int | None = None
    voted_directory_id: str | None = None

    def __post_init__(self) -> None:
        if self.leader_epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, got {self.leader_epoch}")
        for name, value in (("leader id", self.leader_id), ("voted id", self.voted_id)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")

    def to_json(self) -> str:
        body: dict[str, object] = {
            "leaderId": -1 if self.leader_id is None else self.leader_id,
            "leaderEpoch": self.leader_epoch,
            "votedId": -1 if self.voted_id is None else self.voted_id,
        }
        if self.voted_directory_id is not None:
            body["votedDirectoryId"] = self.voted_directory_id
        body["data_version"] = DATA_VERSION
        body[CHECKSUM_KEY] = _checksum(body)
        return json.dumps(body)


def _optional_id(body: dict[str, object], key: str) -> int | None:
    value = body.get(key, -1)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return None if value == -1 else value


def parse_quorum_state(text: str) -> QuorumState:
    """The state in ``text``; ValueError if it is not a valid, intact quorum-state."""
    state, _checked = _parse(text)
    return state


def _parse(text: str) -> tuple[QuorumState, bool]:
    """(state, whether a checksum verified it)."""
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(body) - _KNOWN_KEYS - {CHECKSUM_KEY})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    checked = CHECKSUM_KEY in body
    if checked:
        stored = body[CHECKSUM_KEY]
        computed = _checksum(body)
        if stored != computed:
            raise ValueError(f"CRC-32C mismatch (stored {stored!r}, computed {computed})")
    version = body.get("data_version")
    if version not in (0, 1):
        raise ValueError(f"unsupported data_version {version!r}")
    epoch = body.get("leaderEpoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise ValueError(f"leaderEpoch must be an integer, got {epoch!r}")
    directory = body.get("votedDirectoryId")
    if directory is not None and not isinstance(directory, str):
        raise ValueError(f"votedDirectoryId must be a string, got {directory!r}")
    state = QuorumState(
        leader_epoch=epoch,
        leader_id=_optional_id(body, "leaderId"),
        voted_id=_optional_id(body, "votedId"),
        voted_directory_id=directory,
    )
    return state, checked


class QuorumStateStore:
    """Reads and writes ``<directory>/quorum-state``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / QUORUM_STATE_FILE

    def read(self) -> QuorumState | None:
        """The stored state, or None if the file does not exist yet (a fresh node).

        Raises StorageStateError for a file that exists but is corrupt (unreadable, not the JSON above, a
        value out of range, a checksum mismatch): never guess an epoch or a vote, never reset them.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as exc:
            raise StorageStateError(
                f"corrupt {self.path}: not UTF-8 ({exc.reason} at byte {exc.start})"
            ) from exc
        except OSError as exc:
            raise StorageStateError(f"cannot read {self.path}: {exc}") from exc
        try:
            state, checked = _parse(text)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise StorageStateError(f"corrupt {self.path}: {exc}") from exc
        if not checked:
            _log.warning(
                "quorum_state_unchecked",
                file=str(self.path),
                action="accepted; the next write adds a checksum",
            )
        return state

    def write(self, state: QuorumState) -> None:
        atomic_write(self.path, state.to_json().encode("utf-8"))
