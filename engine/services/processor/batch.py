"""One batch of one partition: the instances it touched and everything it decided.

The state machine opens a :class:`Batch` for every batch; the inbound handlers and the
turn outcome write into it (rows changed, records to produce, counters), and the loop takes
the closed batch's output and table changes to its transaction. Nothing outside the batch
is changed until the loop reports the commit, so an abort is just dropping the batch.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from engine.codec import decode_histories, encode_message, instance_key
from engine.core.errors import TurnstileError
from engine.core.failure import FailureDetails
from engine.core.instance_row import InstanceRow
from engine.core.limits import fit_status
from engine.core.messages import Message
from engine.runtime.executor import WorkflowExecution
from engine.services.dead_letters import dead_letter_of
from engine.services.processor import keys
from engine.services.processor.poison import (
    Quarantine,
    fit_dead_letter,
    instance_of_key,
    turn_error,
)
from engine.services.processor.ports import Headers, OutRecord
from engine.services.processor.state import (
    Counters,
    Environment,
    InstanceCache,
    Loaded,
    Standing,
    standing,
)
from engine.services.processor.tables import Tables
from engine.services.records import RawRecord
from engine.services.tracing import SpanRecord

log = logging.getLogger("engine.processor")


class Batch:
    """What one batch decided, until it is committed or dropped."""

    def __init__(
        self,
        partition: int,
        env: Environment,
        tables: Tables,
        cache: InstanceCache,
        quarantine: Quarantine,
    ) -> None:
        self.partition = partition
        self.env = env
        self.tables = tables
        self._cache = cache
        self._quarantine = quarantine
        self.counters = Counters()
        #: Instances touched in this batch, in first-touch order.
        self.touched: dict[str, Loaded] = {}
        #: Rows changed in this batch: written, with one status record each, at its end.
        self._dirty: dict[str, InstanceRow] = {}
        #: Records to produce in the batch's transaction.
        self.out: list[OutRecord] = []
        #: Table changes (puts and deletes), filled when the batch is closed.
        self.changes: dict[bytes, bytes | None] = {}
        self.closed = False
        #: The input record being handled (set by the state machine around each handler).
        self.current: RawRecord | None = None
        #: Each touched instance's status when the batch first loaded it, and the ids whose
        #: row it removed: what :attr:`status_moves` is computed from when the batch closes.
        self._status_before: dict[str, Standing] = {}
        self._generation_before: dict[str, int] = {}
        self._removed: set[str] = set()
        #: (standing before, standing after) of every instance whose status, workflow or
        #: version the batch changed (None: no row), filled when the batch is closed.
        self.status_moves: list[tuple[Standing, Standing]] = []
        #: The instance whose handling or turn is producing records right now ('' for none):
        #: every output record names it, so a record the broker refuses fails it alone.
        self.origin = ""
        #: Trace context the records ``send`` makes carry (the running turn's span), and the
        #: spans this batch decided, exported only once it commits (``spans.py``).
        self.headers: Headers = ()
        self.spans: list[SpanRecord] = []
        #: When the running turn began (ns) and when its generation began (ms), if traced.
        self.turn_began_ns = 0
        self.run_began_ms: int | None = None

    @property
    def empty(self) -> bool:
        """Nothing was routed here (no record, no timer): nothing to commit."""
        return not self.touched and not self.out

    # --- instances ------------------------------------------------------------------------

    def load(self, instance_id: str) -> Loaded:
        """The instance for this batch; a new, not-yet-started row if none exists."""
        item = self.touched.get(instance_id)
        if item is not None:
            return item
        item = self._cache.get(instance_id)
        if item is None:
            self.counters.cache_misses += 1
            meta = self.tables.load_meta(instance_id) or InstanceRow(instance_id)
            item = Loaded(meta)
            self._cache.put(instance_id, item)
        else:
            self.counters.cache_hits += 1
        self.touched[instance_id] = item
        self._status_before[instance_id] = standing(item.meta)
        self._generation_before[instance_id] = item.meta.generation
        return item

    def execution(self, item: Loaded) -> WorkflowExecution:
        """The instance's execution, rebuilt by replaying its current generation if cold."""
        if item.execution is None:
            meta = item.meta
            self.replay(item, self.tables.history(meta.instance_id, meta.generation_start))
        assert item.execution is not None
        return item.execution

    def replay(self, item: Loaded, rows: list[bytes]) -> None:
        """Rebuild the instance's execution from its current generation's history rows
        (the outcome runs this under the turn watchdog, with a budget that grows with it)."""
        execution = WorkflowExecution(
            self.env.registry, item.meta.instance_id, max_turn_events=self.env.turn_max_events
        )
        execution.replay(decode_histories(rows))
        item.execution = execution

    def quarantined(self, instance_id: str) -> FailureDetails | None:
        """Why an earlier try of this batch could not finish the instance's turn, if it
        could not: the turn is then replaced by a failed end."""
        return self._quarantine.take_instance(instance_id)

    def is_quarantined(self, instance_id: str) -> bool:
        return instance_id in self._quarantine.instances

    def save(self, meta: InstanceRow) -> None:
        """Mark the row changed; it is written (with one status record) when the batch ends."""
        self._dirty[meta.instance_id] = meta

    def remove(self, meta: InstanceRow) -> None:
        """Delete the instance's row and its status (purge); its history stays on the topic.
        The status tombstone is written when the batch ends, unless a new run of the id
        saved a row after it (its status record then replaces the old one)."""
        self._dirty.pop(meta.instance_id, None)
        self._removed.add(meta.instance_id)
        self.tables.delete_meta(meta.instance_id)

    def ended(self) -> list[Loaded]:
        """The runs that ended in this batch: their status became terminal, or a new run
        began and ended in it (the generation moved on)."""
        found = []
        for instance_id, before in self._status_before.items():
            item = self.touched[instance_id]
            after = item.meta.status
            if after is None or not after.is_terminal:
                continue
            new_run = item.meta.generation != self._generation_before[instance_id]
            if new_run or before is None or not before[0].is_terminal:
                found.append(item)
        return found

    # --- output ---------------------------------------------------------------------------

    def emit(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        headers: Headers = (),
    ) -> None:
        self.out.append(OutRecord(topic, key, value, partition, headers, self.origin))

    def emit_all(self, topic: str, key: bytes, values: list[bytes], partition: int | None) -> None:
        """One record per value, all with the same key (a turn's history events): one list
        extension instead of a method call per record."""
        origin = self.origin
        self.out.extend([OutRecord(topic, key, v, partition, (), origin) for v in values])

    def send(self, topic: str, message: Message, partition: int | None = None) -> None:
        """A message to another instance or to the workers, partitioned by its key (or on
        ``partition``: a cancellation that follows a requeued task)."""
        key = instance_key(message.instance_id)
        self.emit(topic, key, encode_message(message), partition, self.headers)

    def dead_letter(self, record: RawRecord, reason: str, kind: str = "Refused") -> None:
        """Park an unusable record with the reason, so the partition can go on. ``kind`` is
        a short, bounded name of the cause (an error class) for the metrics."""
        self.counters.dead_letter(kind)
        log.warning(
            "dead letter from %s[%d]@%d: %s", record.topic, self.partition, record.offset, reason
        )
        cut, reason = fit_dead_letter(record.value, reason, self.env.limits.record)
        value, headers = dead_letter_of(replace(record, value=cut), record.topic, reason)
        origin, self.origin = self.origin, ""  # no instance made it: it must never fail one
        self.emit(self.env.topics.dead_letters, record.key or b"", value, None, headers)
        self.origin = origin

    def dead_letter_current(self, reason: str, kind: str = "Refused") -> None:
        """Park the record being handled: a handler found it valid but cannot keep it."""
        record = self.current
        if record is None:  # pragma: no cover - handlers only run inside accept()
            raise TurnstileError(f"no input record to dead-letter ({reason})")
        self.dead_letter(record, reason, kind)

    # --- end ------------------------------------------------------------------------------

    def close(self) -> None:
        """Write the changed rows with their status records, and turn every table change
        into its changelog record; the batch is then ready for the transaction. Each
        instance gets at most one status record per batch: its row's, or the tombstone of
        a purge."""
        status_topic = self.env.topics.status
        self.status_moves = self._status_moves()
        for instance_id in sorted(self._removed - self._dirty.keys()):
            self.origin = instance_id
            self.emit(status_topic, instance_id.encode(), None, self.partition)
        for meta in self._dirty.values():
            self.origin = meta.instance_id
            status = self._write_row(meta)
            if status is not None or meta.instance_id in self._removed:  # None: a tombstone
                self.emit(status_topic, meta.instance_id.encode(), status, self.partition)
        self._dirty = {}
        self.changes = self.tables.take_changes()
        for key, value in self.changes.items():
            self.origin = instance_of_key(key)
            self.emit(self._changelog_for(key), key, value, self.partition)
        self.origin = ""
        self.closed = True

    def _status_moves(self) -> list[tuple[Standing, Standing]]:
        moves = []
        for instance_id, before in self._status_before.items():
            gone = instance_id in self._removed and instance_id not in self._dirty
            after = None if gone else standing(self.touched[instance_id].meta)
            if after != before:
                moves.append((before, after))
        return moves

    def _write_row(self, meta: InstanceRow) -> bytes | None:
        """Write the row; returns its status record (None once purged), its values
        summarised so that it fits in one record. A row that cannot be encoded fails its
        instance alone."""
        try:
            self.tables.put_meta(meta)
            if not meta.exists and meta.schedule is None:  # a schedule's row has a status
                return None
            return encode_message(fit_status(meta.to_status(), self.env.limits.record))
        except Exception as exc:
            raise turn_error(self.partition, meta.instance_id, exc) from exc

    def _changelog_for(self, key: bytes) -> str:
        if key[:1] == keys.TIMER:
            return self.env.topics.timer_changelog
        return self.env.topics.state_changelog
