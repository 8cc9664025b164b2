"""The dead-letter record for an input record nobody can use: one shape for every component.

The processor (its input topics) and the worker (activity tasks) both park unusable records
this way, so an operator reads one format on the dead-letter topic: the original key and
value, the reason, and where the record came from (in the value and in headers).
"""

from __future__ import annotations

from engine.codec import encode_message
from engine.core.messages import DeadLetter
from engine.services.records import RawRecord

Headers = tuple[tuple[str, bytes], ...]


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
