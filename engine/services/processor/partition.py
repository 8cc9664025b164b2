"""One partition's processor as a closed, sans-I/O state machine.

A loop (the Kafka loop in production, ``engine.testing`` in tests) drives it the same way,
one batch at a time:

1. :meth:`PartitionProcessor.accept` each raw input record: the state machine validates it
   (decodable, accepted on its topic, keyed by its instance id, on its murmur2 partition),
   dead-letters it with the reason if it is unusable, and otherwise routes it to the
   record kind's handler, which only writes into the current :class:`Batch`;
2. :meth:`~PartitionProcessor.fire_due_timers` with the loop's clock;
3. :meth:`~PartitionProcessor.end_batch`: every touched instance runs once, and the closed
   batch holds the records to produce and the table changes;
4. after the loop's transaction, :meth:`~PartitionProcessor.committed` (the changes become
   durable locally) or :meth:`~PartitionProcessor.rolled_back` (the batch never happened).

It never reads a clock, a socket or a topic itself: time and records come in as
arguments, output goes out in the batch, and the only state it keeps is its tables (the
store port) and its cache of hot instances.
"""

from __future__ import annotations

import logging

from engine.core.errors import TurnstileError
from engine.core.messages import Message
from engine.services.processor import keys
from engine.services.processor.batch import Batch
from engine.services.processor.handlers import MESSAGE_HANDLERS, fire_timer
from engine.services.processor.inputs import accepted_kinds, validate
from engine.services.processor.meta import decode_meta
from engine.services.processor.outcome import step_instance
from engine.services.processor.ports import PartitionStore
from engine.services.processor.state import (
    Counters,
    Environment,
    InstanceCache,
    Loaded,
    StatusCounts,
)
from engine.services.processor.tables import Tables
from engine.services.records import RawRecord

log = logging.getLogger("engine.processor")


class PartitionProcessor:
    """The turn logic of one partition (see the module docstring for the protocol)."""

    def __init__(self, partition: int, store: PartitionStore, env: Environment) -> None:
        self.partition = partition
        self.env = env
        self.tables = Tables(partition, store)
        self.cache = InstanceCache(env.cache_capacity)
        #: Totals over every committed or dropped batch of this partition.
        self.counters = Counters()
        #: Committed instances per status, once :meth:`count_statuses` ran (for metrics).
        self.statuses: StatusCounts | None = None
        self._accepts = accepted_kinds(env.topics)
        self._batch = self._open_batch()

    def _open_batch(self) -> Batch:
        return Batch(self.partition, self.env, self.tables, self.cache)

    @property
    def batch(self) -> Batch:
        """The batch in progress (read it; only the state machine writes it)."""
        return self._batch

    # --- input ----------------------------------------------------------------------------

    def accept(self, record: RawRecord, now_ms: int) -> None:
        """Take one input record: route it, or park it in dead letters saying why."""
        batch = self._writable_batch()
        counters = batch.counters
        counters.records += 1
        counters.topics[record.topic] = counters.topics.get(record.topic, 0) + 1
        batch.current = record
        try:
            message = validate(record, self._accepts, self.env.partitions)
            self._dispatch(batch, message, now_ms)
        except TurnstileError as exc:
            batch.dead_letter(record, str(exc), kind=type(exc).__name__)
        finally:
            batch.current = None

    def _dispatch(self, batch: Batch, message: Message, now_ms: int) -> None:
        handler = MESSAGE_HANDLERS.get(type(message))
        if handler is None:  # pragma: no cover - validate() accepts only handled kinds
            raise TurnstileError(f"{message.KIND} records have no handler")
        handler(batch, message, now_ms)

    def fire_due_timers(self, now_ms: int) -> int:
        """Deliver every timer due at ``now_ms`` (in fire-time order); returns how many."""
        batch = self._writable_batch()
        due = self.tables.due_timers(now_ms)
        for timer in due:
            fire_timer(batch, timer, now_ms)
            batch.counters.timer_fired(now_ms - timer.fire_at_ms)
        return len(due)

    def count_statuses(self) -> StatusCounts:
        """Count the committed instances per status (one scan of the instance rows); from
        then on every commit keeps :attr:`statuses` up to date."""
        end = bytes([keys.META[0] + 1])
        rows = self.tables.scan(keys.META, end)
        self.statuses = StatusCounts(decode_meta(raw).status for _, raw in rows)
        return self.statuses

    def next_timer_ms(self) -> int | None:
        """When the earliest timer of this partition is due (None: no timer)."""
        return self.tables.next_timer_ms()

    # --- batch end ------------------------------------------------------------------------

    def end_batch(self, now_ms: int) -> Batch:
        """Run every touched instance once and close the batch: its ``out`` records and
        ``changes`` are what the loop's transaction must hold."""
        batch = self._writable_batch()
        for item in list(batch.touched.values()):
            if item.inbox:
                step_instance(batch, item, now_ms)
        batch.close()
        return batch

    def committed(self, offsets: dict[str, int]) -> None:
        """The batch's transaction committed: make its table changes durable locally,
        together with the changelog offsets (``{"state": n, "timer": m}``) they reached."""
        batch = self._batch
        if not batch.closed:
            raise TurnstileError("committed() before end_batch(): close the batch first")
        self.tables.apply(batch.changes, offsets)
        if self.statuses is not None:
            self.statuses.move(batch.status_moves)
        for instance_id, item in batch.touched.items():
            _settle(self.cache, instance_id, item)
        self._finish(batch)

    def rolled_back(self) -> None:
        """The transaction aborted: forget everything this batch changed."""
        batch = self._batch
        self.tables.drop_overlay()
        for instance_id in batch.touched:
            self.cache.evict(instance_id)
        self._finish(batch)

    def _finish(self, batch: Batch) -> None:
        self.counters.add(batch.counters)
        self._batch = self._open_batch()

    def _writable_batch(self) -> Batch:
        if self._batch.closed:
            raise TurnstileError(
                "the batch is closed: report its commit (committed) or abort (rolled_back) first"
            )
        return self._batch

    def close(self) -> None:
        self.tables.store.close()


def _settle(cache: InstanceCache, instance_id: str, item: Loaded) -> None:
    """After a commit: a finished instance drops its execution; an id with no row and no
    pending events leaves the cache."""
    meta = item.meta
    if meta.status is not None and meta.status.is_terminal:
        item.execution = None
    if not meta.exists and not meta.pending_events:
        cache.evict(instance_id)


__all__ = ["Batch", "Counters", "Environment", "InstanceCache", "Loaded", "PartitionProcessor"]
