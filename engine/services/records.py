"""A record as consumed from a topic, before any decoding.

The worker (activity tasks) and the audit readers (history, changelogs, status) both work on
raw records; they share this one type so that adapters hand over the same shape everywhere.
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
