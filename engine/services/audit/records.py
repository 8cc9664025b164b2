"""What the audit tools read: raw records from a topic, and which history events to keep.

The audit logic works on these plain values so that it runs the same on records read from
Kafka, on events loaded from an exported file and on hand-made records in unit tests.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from engine.core.history import HistoryEvent
from engine.services.records import RawRecord

__all__ = ["EventFilter", "RawRecord", "ReadProgress"]


@dataclass(frozen=True, slots=True)
class ReadProgress:
    """How far a read has come, for progress lines on long reads."""

    topic: str
    records: int
    #: Records between the start and the end offsets when the read began (an upper bound:
    #: transaction markers and compacted-away records take offsets too).
    expected: int
    partitions_done: int
    partitions: int
    elapsed_s: float

    @property
    def fraction(self) -> float:
        return 1.0 if self.expected <= 0 else min(1.0, self.records / self.expected)


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which history events an export or a check keeps: some instances, a time range.

    ``since_ms`` is inclusive and ``until_ms`` exclusive, both on the event's own timestamp
    (when the turn that wrote it ran), not on the Kafka record's.
    """

    instances: Collection[str] | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def wants_key(self, key: bytes | None) -> bool:
        """A cheap pre-check on the record key, before decoding the value."""
        if self.instances is None:
            return True
        return key is not None and key.decode("utf-8", "replace") in self.instances

    def wants(self, event: HistoryEvent) -> bool:
        if self.instances is not None and event.instance_id not in self.instances:
            return False
        if self.since_ms is not None and event.timestamp_ms < self.since_ms:
            return False
        return self.until_ms is None or event.timestamp_ms < self.until_ms
