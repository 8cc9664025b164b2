"""The dead-letter record for an input record nobody can use: one shape for every component.

The processor (its input topics) and the worker (activity tasks) both park unusable records
this way, so an operator reads one format on the dead-letter topic: the original key and
value, the reason, and where the record came from (in the value and in headers).

The worker writes without transactions (ARCHITECTURE "Commit after delivery"), so after a
crash it reads a task again and writes its dead letter again: the topic can hold two
letters for one source record. Readers show one (:class:`FirstPerSource`): the place a
letter names (topic, partition, offset) identifies the record it stands for, and both
copies carry the original key, so they are on the same partition of the dead-letter topic
and the first one read is the older one. A letter the engine made itself, with no source
record (an event kept for an instance that never started: offset -1), is always shown.
"""

from __future__ import annotations

from collections.abc import Hashable

from engine.codec import encode_message
from engine.core.messages import DeadLetter
from engine.services.records import RawRecord

Headers = tuple[tuple[str, bytes], ...]
#: Where a dead letter's source record was read: topic, partition, offset.
SourcePlace = tuple[str, int, int]


def dead_letter_of(record: RawRecord, source_topic: str, reason: str) -> tuple[bytes, Headers]:
    """The encoded DeadLetter for ``record`` and its headers; key it with the original key."""
    letter = DeadLetter(
        instance_id=_instance_of(record.key),
        reason=reason,
        source_topic=source_topic,
        source_partition=record.partition,
        source_offset=record.offset,
        key=record.key,
        value=record.value,
        timestamp_ms=record.timestamp_ms,
    )
    headers = (
        ("reason", reason.encode()),
        ("source-topic", source_topic.encode()),
        ("source-partition", str(record.partition).encode()),
        ("source-offset", str(record.offset).encode()),
    )
    return encode_message(letter), headers


def _instance_of(key: bytes | None) -> str:
    """The instance id the key names, or "" when it names none (no key, not UTF-8)."""
    if not key:
        return ""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def source_place(letter: DeadLetter) -> SourcePlace | None:
    """The source record ``letter`` stands for, or None when the engine made it without one."""
    if letter.source_offset < 0:
        return None
    return (letter.source_topic, letter.source_partition, letter.source_offset)


class FirstPerSource:
    """Tells the first dead letter of each source record from a repeat of it.

    Its memory is one entry per source record seen: what a reader that lists the dead
    letters holds anyway. ``repeats`` counts the letters it called repeats.
    """

    def __init__(self) -> None:
        self._seen: set[Hashable] = set()
        self.repeats = 0

    def first(self, place: Hashable | None) -> bool:
        """Whether a letter from ``place`` is the first one (a None place always is)."""
        if place is None:
            return True
        if place in self._seen:
            self.repeats += 1
            return False
        self._seen.add(place)
        return True
