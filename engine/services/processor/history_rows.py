"""The value of a history row in the state table: the events one turn added, together.

A turn that adds six events writes one row (one RocksDB write, one state changelog record,
one record to restore) instead of six. The row's key is that of its first event
(``keys.history_key(instance, first sequence)``); the events in it have consecutive
sequences. A turn whose events would make a row larger than one record may be (a fan-out
of thousands of activities) writes as many rows as it needs (:func:`pack_rows`). The
public history topic still carries one record per event: only the processor's own table
packs them.

Layout: ``0x01``, then each event's encoded record preceded by its length (4 bytes, big
endian). Rows written before turns were packed hold a single event's record, which begins
with the single-object Avro marker ``0xC3 0x01`` (or, read from elsewhere, Confluent's
``0x00``), never with ``0x01``; :func:`split_row` reads both, so a store or changelog
written by an older processor restores and replays unchanged.
"""

from __future__ import annotations

import struct

__all__ = ["TURN_ROW", "encode_turn_row", "pack_rows", "split_row"]

#: The first byte of a row that holds a turn's events.
TURN_ROW = 0x01
_LENGTH = struct.Struct(">I")


def encode_turn_row(events: list[bytes]) -> bytes:
    """One row holding ``events`` (encoded history records, in sequence order)."""
    parts = [bytes((TURN_ROW,))]
    for data in events:
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def pack_rows(events: list[tuple[int, bytes]], max_bytes: int) -> list[tuple[int, bytes]]:
    """A turn's ``(sequence, encoded event)`` pairs (consecutive sequences) as few rows of
    at most ``max_bytes`` as they fit in, each with the sequence of its first event (an
    event larger than that alone goes in a row of its own)."""
    rows: list[tuple[int, bytes]] = []
    chunk: list[bytes] = []
    first, size = 0, 1
    for sequence, data in events:
        if chunk and size + 4 + len(data) > max_bytes:
            rows.append((first, encode_turn_row(chunk)))
            chunk, size = [], 1
        if not chunk:
            first = sequence
        chunk.append(data)
        size += 4 + len(data)
    if chunk:
        rows.append((first, encode_turn_row(chunk)))
    return rows


def split_row(value: bytes) -> list[bytes]:
    """The encoded events of one history row: a turn's, or the one of an older row."""
    if not value or value[0] != TURN_ROW:
        return [value]
    events = []
    at, end = 1, len(value)
    while at < end:
        (size,) = _LENGTH.unpack_from(value, at)
        at += 4
        if at + size > end:
            raise ValueError(
                f"a history row is cut short: an event of {size} bytes at byte {at} of "
                f"{end}; restore the partition from its changelog"
            )
        events.append(value[at : at + size])
        at += size
    return events
