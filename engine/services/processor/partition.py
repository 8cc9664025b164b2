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

One instance or record never takes the partition down (``poison``): a bug while handling a
record raises :class:`RecordHandlingError`, a bug while finishing an instance's turn (or a
status row that cannot be encoded) raises :class:`InstanceTurnError`. The loop then rolls
the batch back, reports the error to :meth:`~PartitionProcessor.isolate` and does the batch
again, in which the record goes to dead letters and the instance fails alone.

It never reads a clock, a socket or a topic itself: time and records come in as
arguments, output goes out in the batch, and the only state it keeps is its tables (the
store port) and its cache of hot instances.
"""

from __future__ import annotations

import logging
from collections import deque

from engine.core.errors import InstanceTurnError, RecordHandlingError, TurnstileError
from engine.core.failure import failure_from_exception
from engine.core.messages import Message
from engine.services.processor import keys, retention, slots, spans
from engine.services.processor.batch import Batch
from engine.services.processor.handlers import MESSAGE_HANDLERS, fire_timer
from engine.services.processor.inputs import accepted_kinds, validate
from engine.services.processor.meta import decode_meta
from engine.services.processor.outcome import step_instance
from engine.services.processor.poison import Quarantine, turn_error
from engine.services.processor.ports import PartitionStore
from engine.services.processor.state import (
    Counters,
    Environment,
    InstanceCache,
    Loaded,
    StatusCounts,
    standing,
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
        #: Instances and records that must fail alone when the batch is done again.
        self.quarantine = Quarantine()
        self._accepts = accepted_kinds(env.topics)
        self._batch = self._open_batch()
        #: Closed batches whose transactions have not been reported yet, oldest first: a
        #: loop may close the next batch while the previous one commits.
        self._closed: deque[Batch] = deque()
        #: The clock of the last :meth:`end_batch`: when its instances were last used.
        self._ended_ms = 0

    def _open_batch(self) -> Batch:
        return Batch(self.partition, self.env, self.tables, self.cache, self.quarantine)

    @property
    def batch(self) -> Batch:
        """The batch in progress (read it; only the state machine writes it)."""
        return self._batch

    @property
    def uncommitted(self) -> int:
        """Closed batches still waiting for their transaction's outcome."""
        return len(self._closed)

    @property
    def has_work(self) -> bool:
        """Whether the batch in progress holds anything to end and commit (a record, a
        fired timer, a table change); a loop may leave a batch without work open."""
        return not self._batch.empty or bool(self.tables.overlay)

    # --- input ----------------------------------------------------------------------------

    def accept(self, record: RawRecord, now_ms: int) -> None:
        """Take one input record: route it, or park it in dead letters saying why.

        Raises :class:`RecordHandlingError` when handling it failed unexpectedly (a bug, not
        bad input): roll the batch back, :meth:`isolate` the error and do the batch again.
        """
        batch = self._batch
        counters = batch.counters
        counters.records += 1
        counters.topics[record.topic] = counters.topics.get(record.topic, 0) + 1
        batch.current = record
        try:
            message = validate(record, self._accepts, self.env.partitions)
            failed = self.quarantine.take_record(record.topic, record.offset)
            if failed is not None:
                batch.dead_letter(record, f"handling it failed: {failed.stack or failed}")
                return
            self._dispatch(batch, message, now_ms)
        except TurnstileError as exc:
            batch.dead_letter(record, str(exc), kind=type(exc).__name__)
        except Exception as exc:  # a bug: the batch is redone with this record dead-lettered
            details = failure_from_exception(exc, retryable=False)
            raise RecordHandlingError(record.topic, self.partition, record.offset, details) from exc
        finally:
            batch.current = None
            batch.origin = ""

    def _dispatch(self, batch: Batch, message: Message, now_ms: int) -> None:
        handler = MESSAGE_HANDLERS.get(type(message))
        if handler is None:  # pragma: no cover - validate() accepts only handled kinds
            raise TurnstileError(f"{message.KIND} records have no handler")
        batch.origin = message.instance_id
        handler(batch, message, now_ms)

    def fire_due_timers(self, now_ms: int) -> int:
        """Deliver every timer due at ``now_ms`` (in fire-time order); returns how many."""
        batch = self._batch
        due = self.tables.due_timers(now_ms)
        for timer in due:
            batch.origin = timer.instance_id
            if batch.is_quarantined(timer.instance_id):
                self.tables.delete_timer(timer)  # the instance fails when the batch ends
                batch.load(timer.instance_id)
                continue
            try:
                fire_timer(batch, timer, now_ms)
                batch.counters.timer_fired(now_ms - timer.fire_at_ms)
            except Exception as exc:  # a bug firing it: the instance fails alone
                raise turn_error(self.partition, timer.instance_id, exc) from exc
        batch.origin = ""
        return len(due)

    def count_statuses(self) -> StatusCounts:
        """Count the committed instances per status (one scan of the instance rows); from
        then on every commit keeps :attr:`statuses` up to date."""
        end = bytes([keys.META[0] + 1])
        rows = self.tables.scan(keys.META, end)
        self.statuses = StatusCounts(standing(decode_meta(raw)) for _, raw in rows)
        return self.statuses

    def next_timer_ms(self) -> int | None:
        """When the earliest timer of this partition is due (None: no timer)."""
        return self.tables.next_timer_ms()

    # --- batch end ------------------------------------------------------------------------

    def end_batch(self, now_ms: int) -> Batch:
        """Run every touched instance once and close the batch: its ``out`` records and
        ``changes`` are what the loop's transaction must hold.

        Raises :class:`InstanceTurnError` when finishing one instance's turn failed: roll
        the batch back, :meth:`isolate` the error and do the batch again.
        """
        batch = self._batch
        self._ended_ms = now_ms
        for instance_id, item in list(batch.touched.items()):
            if item.inbox or item.wake or item.requeue_checks or batch.is_quarantined(instance_id):
                batch.origin = instance_id
                try:
                    step_instance(batch, item, now_ms)
                except Exception as exc:  # a bug finishing this turn: it fails alone
                    raise turn_error(self.partition, instance_id, exc) from exc
        batch.origin = ""
        slots.release_ended(batch)  # a run that ended gives its concurrency slot back
        retention.arm_ended(batch, now_ms)  # an ended instance is purged after its retention
        batch.close()
        self._closed.append(batch)
        self._batch = self._open_batch()  # the next batch reads this one's pending changes
        return batch

    def isolate(self, error: InstanceTurnError | RecordHandlingError) -> bool:
        """After :meth:`rolled_back`: the instance (or record) behind ``error`` fails alone
        when the batch is done again. False when it already was isolated, so failing it
        alone failed too (the loop then stops rather than loop)."""
        if isinstance(error, InstanceTurnError):
            return self.quarantine.add_instance(error.instance_id, error.details)
        return self.quarantine.add_record(error.topic, error.offset, error.details)

    def committed(self, offsets: dict[str, int]) -> None:
        """The oldest closed batch's transaction committed: make its table changes durable
        locally, together with the changelog offsets (``{"state": n, "timer": m}``) they
        reached."""
        if not self._closed:
            raise TurnstileError("committed() before end_batch(): close the batch first")
        batch = self._closed.popleft()
        self.tables.apply(batch.changes, offsets)
        if self.statuses is not None:
            self.statuses.move(batch.status_moves)
        self.quarantine.committed()
        for instance_id, item in batch.touched.items():
            _settle(self.cache, instance_id, item, self._ended_ms)
        self.cache.trim(self._ended_ms, keep=self._held())
        spans.committed(batch)
        self.counters.add(batch.counters)

    def rolled_back(self) -> None:
        """A transaction aborted: forget everything the uncommitted batches changed, the
        closed ones and the one in progress (each later batch was built on the earlier)."""
        self.tables.drop_overlay()
        self.quarantine.rolled_back()
        for batch in (*self._closed, self._batch):
            for instance_id in batch.touched:
                self.cache.evict(instance_id)
            self.counters.add(batch.counters)
        self._closed.clear()
        self._batch = self._open_batch()

    def _held(self) -> set[str]:
        """Instances a batch not yet committed works on: dropping them from the cache would
        make the next batch that touches them replay their history. (Correctness does not
        rest on this: ``_settle`` never puts back a copy that a later load replaced.)"""
        if not self._closed and not self._batch.touched:
            return set()
        return {i for b in (*self._closed, self._batch) for i in b.touched}

    def close(self) -> None:
        self.tables.store.close()


def _settle(cache: InstanceCache, instance_id: str, item: Loaded, now_ms: int) -> None:
    """After a commit: a finished instance drops its execution (so it is the first to
    leave a full cache); an id with no row and no pending events leaves the cache."""
    cached = cache.get(instance_id)
    if cached is not None and cached is not item:
        return  # a later batch loaded it afresh (this copy left the cache): its copy is newer
    meta = item.meta
    if meta.status is not None and meta.status.is_terminal:
        item.execution = None
    if not meta.exists and not meta.pending_events:
        cache.evict(instance_id)
    else:
        cache.keep(instance_id, item, now_ms)


__all__ = ["Batch", "Counters", "Environment", "InstanceCache", "Loaded", "PartitionProcessor"]
