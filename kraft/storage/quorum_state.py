"""``quorum-state``: the durable election state of a voter, JSON like Kafka's (data_version 1)::

    {"leaderId": 1, "leaderEpoch": 5, "votedId": -1, "votedDirectoryId": "…", "data_version": 1}

-1 means "none" on disk, ``None`` in Python.  The file lives in the metadata log directory and is replaced
atomically (temp, fsync, rename, directory fsync) before the in-memory state changes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from kraft.storage.errors import StorageStateError
from kraft.storage.fileio import atomic_write

QUORUM_STATE_FILE = "quorum-state"
DATA_VERSION = 1


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
        return json.dumps(body)


def _optional_id(body: dict[str, object], key: str) -> int | None:
    value = body.get(key, -1)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return None if value == -1 else value


def parse_quorum_state(text: str) -> QuorumState:
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    version = body.get("data_version")
    if version not in (0, 1):
        raise ValueError(f"unsupported data_version {version!r}")
    epoch = body.get("leaderEpoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise ValueError(f"leaderEpoch must be an integer, got {epoch!r}")
    directory = body.get("votedDirectoryId")
    if directory is not None and not isinstance(directory, str):
        raise ValueError(f"votedDirectoryId must be a string, got {directory!r}")
    return QuorumState(
        leader_epoch=epoch,
        leader_id=_optional_id(body, "leaderId"),
        voted_id=_optional_id(body, "votedId"),
        voted_directory_id=directory,
    )


class QuorumStateStore:
    """Reads and writes ``<directory>/quorum-state``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / QUORUM_STATE_FILE

    def read(self) -> QuorumState | None:
        """The stored state, or None if the file does not exist yet (a fresh node).

        Raises StorageStateError for a file that exists but is corrupt: never guess an epoch or a vote.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageStateError(f"cannot read {self.path}: {exc}") from exc
        try:
            return parse_quorum_state(text)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise StorageStateError(f"corrupt {self.path}: {exc}") from exc

    def write(self, state: QuorumState) -> None:
        atomic_write(self.path, state.to_json().encode("utf-8"))
