"""A partition's tables as seen during a batch: committed rows plus uncommitted layers.

A turn's changes must reach RocksDB only after its Kafka transaction commits, so every write
goes to the overlay first. The overlay doubles as the list of changelog records to produce.
When its batch closes it becomes a *pending* layer: still read (the next batch may run its
turns while this one's transaction commits), then applied to the store in one write when
that transaction commits, or dropped with every later layer when it aborts.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.core.instance_row import InstanceRow
from engine.services.processor import keys
from engine.services.processor.history_rows import split_row
from engine.services.processor.meta import decode_meta, encode_meta
from engine.services.processor.ports import PartitionStore

#: Names under which a partition records how far it has applied each changelog.
STATE_CHANGELOG = "state"
TIMER_CHANGELOG = "timer"


class Tables:
    def __init__(self, partition: int, store: PartitionStore) -> None:
        self.partition = partition
        self.store = store
        self.overlay: dict[bytes, bytes | None] = {}
        #: Closed batches' changes whose transactions have not committed yet, oldest first.
        self._pending: list[dict[bytes, bytes | None]] = []
        #: The earliest timer's fire time, remembered between writes to the timer table:
        #: the loop asks every owned partition for it before every poll and again to fire
        #: due timers, and with many partitions per replica those store scans were a fixed
        #: cost of every batch (not known again until the next read after a timer write).
        self._next_timer: int | None = None
        self._next_timer_known = False

    # --- reads ----------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        if key in self.overlay:
            return self.overlay[key]
        for layer in reversed(self._pending):
            if key in layer:
                return layer[key]
        return self.store.get(key)

    def _unwritten(self, start: bytes, end: bytes) -> list[tuple[bytes, bytes | None]]:
        """The uncommitted writes in ``[start, end)``, newest per key, in key order."""
        if not self._pending:
            return sorted((k, v) for k, v in self.overlay.items() if start <= k < end)
        merged: dict[bytes, bytes | None] = {}
        for layer in (*self._pending, self.overlay):
            merged.update((k, v) for k, v in layer.items() if start <= k < end)
        return sorted(merged.items())

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Committed rows merged with the overlay, in key order: lazily, so a reader that
        wants the first row (the earliest timer) reads the store up to it, not the whole
        range, even when the batch wrote into it."""
        pending = self._unwritten(start, end)
        if not pending:
            yield from self.store.scan(start, end)
            return
        stored = self.store.scan(start, end)
        row = next(stored, None)
        for key, value in pending:
            while row is not None and row[0] < key:
                yield row
                row = next(stored, None)
            if row is not None and row[0] == key:
                row = next(stored, None)  # the overlay's value wins
            if value is not None:
                yield key, value
        while row is not None:
            yield row
            row = next(stored, None)

    def load_meta(self, instance_id: str) -> InstanceRow | None:
        raw = self.get(keys.meta_key(instance_id))
        return None if raw is None else decode_meta(raw)

    def history(self, instance_id: str, first_sequence: int) -> list[bytes]:
        """The encoded events from ``first_sequence`` on (a generation starts at a row's
        first event), unpacked from their rows (``history_rows``)."""
        start = keys.history_key(instance_id, first_sequence)
        end = keys.history_prefix(instance_id)[:-1] + b"\x01"
        return [event for _, value in self.scan(start, end) for event in split_row(value)]

    def due_timers(self, now_ms: int, limit: int = 1000) -> list[keys.TimerKey]:
        earliest = self.next_timer_ms()
        if earliest is None or earliest > now_ms:
            return []  # the common case, answered without a scan
        start = keys.TIMER
        end = keys.timer_key(keys.TimerKey(now_ms + 1, "", 0, -(2**31)))
        out: list[keys.TimerKey] = []
        for raw, _ in self.scan(start, end):
            out.append(keys.parse_timer_key(raw))
            if len(out) >= limit:
                break
        return out

    def next_timer_ms(self) -> int | None:
        """Fire time of the earliest timer (committed or written in this batch), if any."""
        if not self._next_timer_known:
            self._next_timer = self._scan_next_timer()
            self._next_timer_known = True
        return self._next_timer

    def _scan_next_timer(self) -> int | None:
        end = keys.TIMER[:-1] + bytes([keys.TIMER[0] + 1])
        for raw, _ in self.scan(keys.TIMER, end):
            return keys.parse_timer_key(raw).fire_at_ms
        return None

    # --- writes ---------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes | None) -> None:
        if key.startswith(keys.TIMER):
            self._next_timer_known = False
        self.overlay[key] = value

    def put_meta(self, meta: InstanceRow) -> None:
        self.overlay[keys.meta_key(meta.instance_id)] = encode_meta(meta)

    def delete_meta(self, instance_id: str) -> None:
        self.overlay[keys.meta_key(instance_id)] = None

    def delete_history(self, instance_id: str, first: int, end: int) -> None:
        """Delete the rows of sequences ``first`` to ``end`` (a row is keyed by its first
        event, and no row spans a generation's start, so this leaves no event behind)."""
        for seq in range(first, end):
            self.overlay[keys.history_key(instance_id, seq)] = None

    def put_timer(self, key: keys.TimerKey) -> None:
        self._next_timer_known = False
        self.overlay[keys.timer_key(key)] = b""

    def delete_timer(self, key: keys.TimerKey) -> None:
        self._next_timer_known = False
        self.overlay[keys.timer_key(key)] = None

    def timers_of(self, instance_id: str) -> list[keys.TimerKey]:
        """All timers of one instance (a full scan: only used on purge)."""
        found = []
        for raw, _ in self.scan(keys.TIMER, keys.TIMER[:-1] + bytes([keys.TIMER[0] + 1])):
            key = keys.parse_timer_key(raw)
            if key.instance_id == instance_id:
                found.append(key)
        return found

    # --- batch end ------------------------------------------------------------------------

    def take_changes(self) -> dict[bytes, bytes | None]:
        """The closing batch's changes; they stay readable as a pending layer until
        :meth:`apply` (its commit) or :meth:`drop_overlay` (an abort)."""
        self._next_timer_known = False
        changes, self.overlay = self.overlay, {}
        self._pending.append(changes)
        return changes

    def apply(self, changes: dict[bytes, bytes | None], offsets: dict[str, int]) -> None:
        """Write committed changes plus the changelog offsets they reached, atomically
        (the oldest pending layer: transactions commit in the order their batches closed)."""
        self._next_timer_known = False
        batch = dict(changes)
        for name, offset in offsets.items():
            batch[keys.offset_key(name)] = str(offset).encode()
        if batch:
            self.store.write(batch)
        if self._pending and self._pending[0] is changes:
            self._pending.pop(0)  # a batch's commit (rows restored from a changelog are not)

    def recorded_offset(self, name: str) -> int | None:
        raw = self.store.get(keys.offset_key(name))
        return None if raw is None else int(raw)

    def drop_overlay(self) -> None:
        """An abort: forget every uncommitted write, the pending layers' too (a later
        batch was built on the earlier ones)."""
        self._next_timer_known = False
        self.overlay = {}
        self._pending = []
