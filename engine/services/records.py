"""A record as consumed from a topic, before any decoding.

The processor (its input topics), the worker (activity tasks) and the audit readers
(history, changelogs, status) all work on raw records; they share this one type so that
adapters, and the in-process test engine, hand over the same shape everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as stored on a topic; ``value`` is None for a tombstone."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0
    #: The topic it was read from (readers of a single topic may leave it empty).
    topic: str = ""
    headers: tuple[tuple[str, bytes], ...] = ()
