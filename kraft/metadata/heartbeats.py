"""Broker heartbeat tracking: soft state on the active controller (Kafka's BrokerHeartbeatManager).

Contact times are recorded the moment a heartbeat arrives, before any state-machine work, so a busy
controller never fences a live broker for its own slowness (KAFKA-15019/17793).  Unfenced brokers sit
in an ordered map by last contact, so finding the stalest is O(1) and the periodic check fences one
broker at a time.  A newly active controller calls :meth:`reset` to give every registered broker a
fresh session (KAFKA-18138).  Pure: times are passed in as ``now_ms``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class BrokerContact:
    last_contact_ms: int
    metadata_offset: int = -1
    heartbeats: int = 0


def applied_offset(contact: BrokerContact | None, next_offset: int) -> int:
    """The metadata offset a broker can really have applied, as its last heartbeat reported it, or -1
    (Kafka's "unknown") when it never reported one or claimed one the log does not hold yet (at or past
    ``next_offset``, the offset the next record gets): the controller fleet benchmark's brokers report
    2**50 ("everything"), and a broken broker could too.  The bound is the log's next offset, not the
    high watermark: a new leader's high watermark can trail what an honest broker applied."""
    if contact is None or not 0 <= contact.metadata_offset < next_offset:
        return -1
    return contact.metadata_offset


class HeartbeatTracker:
    def __init__(self, session_timeout_ms: int) -> None:
        self.session_timeout_ms = session_timeout_ms
        self._contacts: dict[int, BrokerContact] = {}
        self._unfenced: OrderedDict[int, None] = OrderedDict()  # oldest contact first

    def reset(self, brokers: Iterable[tuple[int, bool]], now_ms: int) -> None:
        """Forget everything and start a fresh session for each ``(broker_id, fenced)``."""
        self._contacts.clear()
        self._unfenced.clear()
        for broker_id, fenced in brokers:
            self._contacts[broker_id] = BrokerContact(now_ms)
            if not fenced:
                self._unfenced[broker_id] = None

    def touch(self, broker_id: int, now_ms: int, metadata_offset: int) -> None:
        contact = self._contacts.get(broker_id)
        if contact is None:
            contact = self._contacts[broker_id] = BrokerContact(now_ms)
        contact.last_contact_ms = max(contact.last_contact_ms, now_ms)
        contact.metadata_offset = max(contact.metadata_offset, metadata_offset)
        contact.heartbeats += 1
        if broker_id in self._unfenced:
            self._unfenced.move_to_end(broker_id)

    def register(self, broker_id: int, now_ms: int) -> None:
        """A new registration: a fresh, fenced session (its old contact data is dropped)."""
        self._contacts[broker_id] = BrokerContact(now_ms)
        self._unfenced.pop(broker_id, None)

    def set_fenced(self, broker_id: int, fenced: bool) -> None:
        if fenced:
            self._unfenced.pop(broker_id, None)
        elif broker_id in self._contacts and broker_id not in self._unfenced:
            # Brokers are unfenced while answering their heartbeat, so their contact is the newest:
            # appending keeps the map ordered by contact.
            self._unfenced[broker_id] = None

    def remove(self, broker_id: int) -> None:
        self._contacts.pop(broker_id, None)
        self._unfenced.pop(broker_id, None)

    def contact(self, broker_id: int) -> BrokerContact | None:
        return self._contacts.get(broker_id)

    def has_valid_session(self, broker_id: int, now_ms: int) -> bool:
        contact = self._contacts.get(broker_id)
        return contact is not None and now_ms - contact.last_contact_ms <= self.session_timeout_ms

    def next_expired(self, now_ms: int) -> int | None:
        """The unfenced broker with the oldest contact if its session has expired, else None."""
        for broker_id in self._unfenced:
            if now_ms - self._contacts[broker_id].last_contact_ms > self.session_timeout_ms:
                return broker_id
            return None
        return None

    def extend_all(self, delay_ms: int) -> None:
        """Push every deadline back (the controller itself was stalled; don't blame the brokers)."""
        for contact in self._contacts.values():
            contact.last_contact_ms += delay_ms

    def hold(self, delay_ms: int, now_ms: int) -> None:
        """Push every deadline back by ``delay_ms``, but no contact past ``now_ms`` (the heartbeats arrive
        late: kraft.metadata.session_checker).  Keeps the unfenced map's order (a monotone shift)."""
        for contact in self._contacts.values():
            if contact.last_contact_ms < now_ms:
                contact.last_contact_ms = min(contact.last_contact_ms + delay_ms, now_ms)

    def unfenced_count(self) -> int:
        return len(self._unfenced)

    def unfenced_ids(self) -> list[int]:
        return list(self._unfenced)
