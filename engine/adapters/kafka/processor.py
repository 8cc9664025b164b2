"""The processor's Kafka loop: batches of turns, each committed in one transaction.

The loop owns the I/O; each partition's :class:`PartitionProcessor` (a sans-I/O state
machine) owns the turn logic. :meth:`ProcessorRunner.run_batch` is the commit protocol as
the numbered steps of ``protocol.Step`` (ARCHITECTURE, "The commit protocol"): poll, accept,
timers, step, produce, offsets, commit, apply. The last two of a batch run on the
committer (``kafka.inflight``) while the next batch polls, accepts and runs its turns.

Abort path: the batches not yet committed are dropped (nothing reached RocksDB) and the
consumer seeks back, so they are simply done again; an error of one instance or record is
isolated first (``engine.services.processor.poison``), so the redo fails it alone. Any
other error abandons the batches and stops the replica; nothing is committed after that.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import wait
from pathlib import Path
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from engine.adapters.kafka.admin import TaskQueueTopics
from engine.adapters.kafka.config import (
    admin_config,
    consumer_config,
    processor_producer_config,
)
from engine.adapters.kafka.deadline import ends_process_if_stuck
from engine.adapters.kafka.fencing import Fencing, stamped
from engine.adapters.kafka.group_protocol import (
    announce,
    processor_group_config,
    uses_consumer_protocol,
)
from engine.adapters.kafka.inflight import Committer, InFlight, changelog_offsets
from engine.adapters.kafka.io import (
    AbortedTransaction,
    Delivered,
    TransactionalProducer,
    leave_group,
    message_headers,
    poll_batch,
)
from engine.adapters.kafka.isolation import Produced, produce_batch, refused_in_delivery
from engine.adapters.kafka.liveness import LivenessWatch
from engine.adapters.kafka.payloads import payload_store
from engine.adapters.kafka.recovery import Recovery
from engine.adapters.kafka.restore import RestoreReport, restore_partitions
from engine.adapters.kafka.standby import Standbys
from engine.adapters.kafka.takeover import Takeover
from engine.adapters.rocks_store import RocksPartitionStore
from engine.adapters.schema_registry import connect_schema_registry
from engine.config.settings import Settings
from engine.config.topics import TopicNames, topic_names
from engine.core.errors import (
    BrokerError,
    BrokerRefusalError,
    InstanceTurnError,
    RecordHandlingError,
)
from engine.runtime.registry import Registry
from engine.services.processor.batch import Batch
from engine.services.processor.partition import PartitionProcessor
from engine.services.processor.protocol import (
    BatchMetrics,
    Clock,
    NoMetrics,
    Step,
    SystemClock,
    poll_wait_s,
)
from engine.services.processor.state import Progress, environment_for
from engine.services.records import RawRecord
from engine.services.tracing import NoTracing, TraceHook

log = logging.getLogger("engine.processor")

#: How long closing may take (leaving the group, a last commit) before the process ends itself.
CLOSE_S = 60.0

#: The longest one poll blocks when no timer is due sooner: the loop looks at its stop
#: flag between polls, so this bounds how long a stop request waits.
MAX_POLL_WAIT_S = 0.5

#: The longest one poll blocks while partitions are being taken over: a restored
#: partition waits at most this long to be opened for work.
TAKEOVER_POLL_WAIT_S = 0.02


#: Which steps' durations the progress totals keep, and under which field.
_PROGRESS_TIME = {
    Step.STEP: "turn_s",
    Step.PRODUCE: "produce_s",
    Step.OFFSETS: "offsets_s",
    Step.COMMIT: "commit_s",
}


class ProcessorRunner:
    """One processor replica: owns the partitions the consumer group assigns it."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        *,
        on_assigned: Callable[[list[int]], None] | None = None,
        clock: Clock | None = None,
        metrics: BatchMetrics | None = None,
        count_statuses: bool = False,
        tracing: TraceHook | None = None,
    ) -> None:
        """``count_statuses``: keep each owned partition's instances per status
        (``PartitionProcessor.statuses``), at the cost of one scan of its instance rows when
        it is assigned; a metrics exporter turns on what it serves."""
        self.settings = settings
        self.topics: TopicNames = topic_names(settings.namespace)
        self.env = environment_for(settings, registry, self.topics, tracing or NoTracing())
        # replay reads large payloads from the payloads topic, turns write them there
        self.env.payload_offsets = payload_store(settings).end_offset
        self.partitions: dict[int, PartitionProcessor] = {}
        self.progress = Progress()
        self._clock: Clock = clock or SystemClock()
        self._metrics: BatchMetrics = metrics or NoMetrics()
        self._count_statuses = count_statuses
        #: True once the first assignment is restored (a readiness probe's answer).
        self.ready = False
        #: Records behind each consumed input partition's end, after its last commit (from
        #: the high watermark of the last fetch, no broker round trip).
        self.lag: dict[tuple[str, int], int] = {}
        self._on_assigned = on_assigned
        #: The first offset the batch in progress took from each input partition.
        self._batch_start: dict[tuple[str, int], int] = {}
        #: The same for each closed batch not yet committed, oldest first: an abort seeks
        #: back to the first of them all.
        self._starts: list[dict[tuple[str, int], int]] = []
        #: The closed batch whose transaction is committing (kafka.inflight), if any.
        self._in_flight: InFlight | None = None
        #: The offset after the last record accepted, per input partition: what the batch
        #: commits (not the consumer's position, which may already be past records fetched
        #: but not accepted when a revocation commits mid-batch).
        self._batch_next: dict[tuple[str, int], int] = {}
        #: Set once a batch failed beyond repair: nothing may be committed after it.
        self._failed = False
        #: New partitions being fenced and restored beside the work (kafka.takeover).
        self._takeovers: list[Takeover[PartitionProcessor]] = []
        #: The partitions the last revocation took from this replica while it processed
        #: them (an eager rebalance's assignment often gives them straight back).
        self._held_before: set[int] = set()
        #: Warm copies of partitions this replica would take over (``standby_replicas``).
        self.standbys: Standbys | None = None
        self._client_id = f"{settings.namespace}.processor.{settings.replica_id}"
        self._recovery = Recovery(f"processor {settings.replica_id}")
        #: How history, status and outcomes are framed (checks the registry, if any, first).
        self._wire = connect_schema_registry(settings)
        #: The topics whose offsets the batch reads back (``inflight.changelog_offsets``).
        self._tracked = frozenset((self.topics.state_changelog, self.topics.timer_changelog))
        self._consumer = self._new_consumer()
        self._producer = self._new_producer()
        self._committer = Committer(settings.replica_id)
        self._fencing = Fencing(
            self._client_id,
            settings.processor_group,
            producer=self._producer_config(),
            admin=admin_config(settings.bootstrap_servers) | settings.extra_kafka,
            offsets=consumer_config(settings.bootstrap_servers, settings.processor_group)
            | settings.extra_kafka,
        )

    def _new_consumer(self) -> Consumer:
        settings = self.settings
        config = consumer_config(
            settings.bootstrap_servers, settings.processor_group, client_id=self._client_id
        )
        config.update(processor_group_config(settings))
        config.update(settings.extra_kafka)
        #: The name the group knows this replica's consumer by (see kafka.fencing).
        self._member = str(config.get("client.id", self._client_id))
        self._consumer_config = config
        return Consumer(config)

    def _new_producer(self) -> TransactionalProducer:
        """A transactional producer under the replica's id; its ``init_transactions`` fences
        any earlier one and aborts what that left open."""
        return TransactionalProducer(self._producer_config(), self._client_id)

    def _producer_config(self) -> dict[str, Any]:
        return processor_producer_config(self.settings, self._client_id)

    @property
    def standby_lag(self) -> dict[int, int]:
        """Offsets each standby copy is behind its changelogs' committed end (a metric)."""
        return {} if self.standbys is None else dict(self.standbys.lag)

    @property
    def standby_applied(self) -> int:
        """Changelog records applied to standby copies since the start (a metric)."""
        return 0 if self.standbys is None else self.standbys.applied

    @functools.cached_property
    def _queues(self) -> TaskQueueTopics:
        """Creates a task queue's topic before the first batch that produces to it."""
        return TaskQueueTopics(self.settings)

    # --- lifecycle --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run batches until ``stop`` is set. A Kafka failure (fenced, stalled past the
        transaction timeout, a broker that went away) recreates the clients and rejoins,
        within the bounds of :class:`Recovery`; anything else stops the replica."""
        if uses_consumer_protocol(self.settings):
            announce(self.settings)
        self._subscribe()
        watch = self._watch_peers()
        if watch is not None and self.settings.standby_replicas:
            peers = watch.peers
            self.standbys = Standbys(
                self.settings,
                self.topics,
                lambda: peers.alive(time.monotonic()),
                self._partition_path,
            )
            self.standbys.start()
        try:
            while not stop.is_set():
                try:
                    self.run_batch()
                except BrokerRefusalError:
                    raise
                except (BrokerError, KafkaException) as exc:
                    self._rejoin(exc, stop)
                else:
                    self._recovery.succeeded(self.progress.transactions + self.progress.restores)
        finally:
            if self.standbys is not None:  # first: closing revokes, which would reopen copies
                self.standbys.stop()
            self.close()
            if watch is not None:
                watch.stop(left=True)

    def _watch_peers(self) -> LivenessWatch | None:
        """Write this replica's liveness records and evict a silent peer (kafka.liveness);
        none when turned off or without static membership (nothing to evict by), and under
        the consumer group protocol (kafka.group_protocol: no replacement under a static id)."""
        if uses_consumer_protocol(self.settings):
            return None
        if not (self.settings.liveness_interval_ms and self.settings.static_membership):
            return None
        watch = LivenessWatch(
            self.settings, self.topics.replicas, self._member, self._inputs, self._consumer_config
        )
        watch.start()
        return watch

    @property
    def _inputs(self) -> list[str]:
        return [self.topics.commands, self.topics.activity_results, self.topics.instance_messages]

    def _subscribe(self) -> None:
        inputs = self._inputs
        self._consumer.subscribe(inputs, on_assign=self._assigned, on_revoke=self._revoked)
        log.info("processor %s consuming %s", self.settings.replica_id, ", ".join(inputs))

    def _rejoin(self, cause: BaseException, stop: threading.Event) -> None:
        """Drop the consumer and the producer and start again as on a restart: the new
        producer fences the old one, the new consumer takes the replica's place in the group
        (static membership) and restores its partitions from the committed end. The failed
        batch was abandoned, so nothing of it is applied or committed."""
        self._recovery.failed(cause)  # raises once the bounds are used up
        with ends_process_if_stuck(f"processor {self.settings.replica_id} rejoining", CLOSE_S):
            try:
                self._consumer.close()  # the revocation abandons: nothing is committed
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing the consumer to rejoin: %s", exc)
            self._cancel_takeovers()
            for pp in self.partitions.values():
                pp.close()
            self._unclaim(list(self.partitions))
            self.partitions.clear()
            self._producer.close()
        while True:
            if stop.wait(self._recovery.backoff_s()):
                return  # stopping: close() follows (closing the clients again does nothing)
            try:
                self._producer = self._new_producer()
                break
            except BrokerError as exc:
                self._recovery.failed(exc, again=True)
        self._failed = False
        self._consumer = self._new_consumer()
        self._subscribe()

    def close(self) -> None:
        log.info("processor %s stopping: %s", self.settings.replica_id, self.progress)
        restoring = sorted(p for t in self._takeovers for p in t.partitions)
        if restoring:  # never processed: their next owner restores them again
            log.info(
                "processor %s stopped while restoring partitions %s",
                self.settings.replica_id,
                restoring,
            )
        with ends_process_if_stuck(f"stopping processor {self.settings.replica_id}", CLOSE_S):
            if not self._failed:
                self._settle_in_flight()  # the last batch's commit, applied before leaving
            try:
                leave_group(self._consumer)  # hand the partitions over now (static member)
            except Exception as exc:  # the revocation failed: closing still has to happen
                log.warning("leaving the consumer group: %s", exc)
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:  # pragma: no cover - best effort
                log.warning("closing consumer: %s", exc)
            self._cancel_takeovers()
            for pp in self.partitions.values():
                pp.close()
            self._unclaim(list(self.partitions))
            self.partitions.clear()
            self._committer.close()
            self._producer.close()
            self.env.watchdog.close()

    # --- one batch: the commit protocol -------------------------------------------------------

    def run_batch(self) -> int:
        """Run one batch through the commit protocol; returns the records it consumed.

        A poisoned instance or record takes the abort path with isolation (``_isolate``);
        any other error abandons the batch before it leaves (so closing the consumer can
        never commit half of it) and stops the replica."""
        try:
            try:
                return self._run_steps()
            except (InstanceTurnError, RecordHandlingError) as exc:
                self._isolate(exc)  # the abort path, with the poisoned one set apart
                return 0
        except BaseException:
            self._failed = True
            self._abandon()
            raise

    def _run_steps(self) -> int:
        """Steps 1-8 (or the abort path); the previous batch's 7-8 may still be running
        (``kafka.inflight``) while this one polls, accepts and runs its turns."""
        self._adopt_takeovers()  # partitions restored meanwhile join this batch
        # 1-2. poll (until the next timer is due) and accept, until full, old or idle
        count = self._poll_and_accept()
        # 3. fire due timers
        now_ms = self._clock.now_ms()
        fired = self._fire_due_timers(now_ms)
        if count or fired:
            if not self._may_overlap():
                self._finish_in_flight()
            # 4-8 (or the abort path); 7-8 are left running
            self._commit(now_ms, wait=False)
        else:
            self._finish_in_flight()
        return count

    def _may_overlap(self) -> bool:
        """Whether this batch's turns may run while the previous transaction commits: not
        while an instance or record waits to fail alone (the abort path is one batch at a
        time, so that its redo finds what it isolated)."""
        return not any(
            pp.quarantine.instances or pp.quarantine.records for pp in self.partitions.values()
        )

    def _poll_and_accept(self) -> int:
        """Steps 1 and 2. The first wait ends as soon as one record arrives (``poll_batch``);
        after that only what is already fetched is taken, so a lone record is not held back
        waiting for company."""
        limit, budget = self.settings.max_batch, self.settings.max_batch_ms / 1000
        started = t = self._clock.monotonic()
        messages = poll_batch(self._consumer, limit, self._idle_wait())
        count = 0
        while messages:
            t = self._observe(Step.POLL, t, len(messages))
            now_ms = self._clock.now_ms()
            for message in messages:
                self._accept(message, now_ms)
            count += len(messages)
            t = self._observe(Step.ACCEPT, t, len(messages))
            if count >= limit or t - started >= budget:
                break
            messages = self._consumer.consume(limit - count, 0)
        return count

    def _idle_wait(self) -> float:
        """Seconds to block for input: until the earliest timer of an owned partition is due
        (new input ends the wait sooner), and at most ``MAX_POLL_WAIT_S``."""
        if self._in_flight is not None:
            return 0.0  # take what is already fetched, or go and finish the commit
        due = [t for pp in self.partitions.values() if (t := pp.next_timer_ms()) is not None]
        longest = TAKEOVER_POLL_WAIT_S if self._takeovers else MAX_POLL_WAIT_S
        return poll_wait_s(min(due, default=None), self._clock.now_ms(), longest)

    def _accept(self, message: Message, now_ms: int) -> None:
        error = message.error()
        if error is not None:
            if error.fatal() or error.code() == KafkaError._FATAL:  # the consumer is dead
                raise BrokerError(f"the consumer failed for good: {error}")
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", error)
            return
        topic, partition = message.topic() or "", message.partition() or 0
        pp = self.partitions.get(partition)
        if pp is None:  # pragma: no cover - a partition that is not restored is paused
            return
        offset = message.offset() or 0
        self._batch_start.setdefault((topic, partition), offset)
        self._batch_next[(topic, partition)] = offset + 1
        headers = message_headers(message)
        record = RawRecord(
            partition,
            offset,
            message.key(),
            message.value(),
            message.timestamp()[1],
            topic,
            headers,
        )
        pp.accept(record, now_ms)

    def _fire_due_timers(self, now_ms: int) -> int:
        t = self._clock.monotonic()
        fired = sum(pp.fire_due_timers(now_ms) for pp in self.partitions.values())
        self._observe(Step.TIMERS, t, fired)
        return fired

    def _commit(self, now_ms: int, *, wait: bool = True) -> None:
        """Steps 4-8 of the protocol, or the abort path; with ``wait=False`` steps 7-8 are
        left to finish while the loop goes on (:meth:`_finish_in_flight` collects them)."""
        # 4. step every touched instance; each partition closes its batch
        t = self._clock.monotonic()
        batches = self._end_batches(now_ms)  # an error: _isolate settles the previous first
        outputs: list[Produced] = [(p, r) for p, b in batches.items() for r in b.out]
        offsets = self._consumed_positions()
        self._starts.append(self._batch_start)
        self._batch_start, self._batch_next = {}, {}
        t = self._observe(Step.STEP, t, sum(len(b.touched) for b in batches.values()))
        # 7-8 of the previous batch: its outcome decides whether this one may go on
        if not self._finish_in_flight():
            return  # it aborted, and this batch (built on it) was dropped with it
        if not outputs and not offsets:
            self._apply(batches, [])  # nothing to make durable
            return
        self._begin_transaction(batches, outputs, offsets)
        if wait:
            self._finish_in_flight()

    def _begin_transaction(
        self,
        batches: dict[int, Batch],
        outputs: list[Produced],
        offsets: list[TopicPartition],
    ) -> None:
        """Steps 5-6, and 7 started on the committer."""
        t = self._clock.monotonic()
        self.progress.outputs += len(outputs)
        try:
            self._queues.ensure(r.topic for _, r in outputs)  # a new task queue's topic
        except BrokerError as exc:  # the broker is busy or away: redo the batch later
            log.warning("could not create a task queue's topic, redoing the batch: %s", exc)
            self._rollback()
            return
        try:
            self._producer.begin()
            # 5. produce the batch's output inside the transaction (a record over the
            # record limit or refused up front raises InstanceTurnError for its origin)
            produce_batch(
                self._producer, outputs, self.env.limits.record, self._wire, self._tracked
            )
            self._observe(Step.PRODUCE, t, len(outputs))
        except AbortedTransaction as exc:
            self._aborted(exc, outputs)
            return
        except InstanceTurnError:
            raise  # run_batch aborts the transaction and redoes the batch without it
        except BaseException:
            self._abandon()
            raise
        # 6-7. add the consumed offsets and commit, on the committer (kafka.inflight)
        group = self._consumer.consumer_group_metadata()
        outcome = self._committer.start(self._producer, offsets, group)
        self._in_flight = InFlight(batches, outputs, offsets, outcome)

    def _finish_in_flight(self) -> bool:
        """Steps 7-8 of the batch in flight (none: True at once): wait for its commit and
        apply it; False when it aborted (every later batch is dropped with it)."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return True
        t = self._clock.monotonic()
        try:
            done = flight.outcome.result()
        except AbortedTransaction as exc:
            self._aborted(exc, flight.outputs)
            return False
        except BaseException:
            # Anything else stops the replica. Forget the batches first: closing the consumer
            # runs the revocation callback, which would otherwise commit their input offsets
            # without their output (or fail on the open transaction and hide this error).
            self._abandon()
            raise
        self._report(Step.OFFSETS, done.offsets_s, len(flight.offsets))
        self._report(Step.COMMIT, done.commit_s, 1)
        self.progress.transactions += 1
        self._note_lag(flight.offsets)
        # 8. apply the committed changes to RocksDB, with the changelog offsets reached
        self._apply(flight.batches, done.delivered)
        self._observe(Step.APPLY, t, sum(len(b.changes) for b in flight.batches.values()))
        return True

    def _aborted(self, exc: AbortedTransaction, outputs: list[Produced]) -> None:
        """The abort path: a record the broker refused fails its instance alone (run_batch
        isolates it); otherwise drop the batches and seek back, so the input is redone."""
        refused = refused_in_delivery(self._producer, outputs)
        if refused is not None:
            raise refused from exc
        log.warning("transaction aborted, redoing the batch: %s", exc)
        t = self._clock.monotonic()
        self.progress.aborts += 1
        self._rollback()
        self._observe(Step.ABORT, t, 1)

    def _settle_in_flight(self) -> None:
        """Before the abort path of a later batch: the batch in flight commits and applies,
        or rolls back with everything after it (a record of it the broker refused is found
        again when it is redone)."""
        try:
            self._finish_in_flight()
        except InstanceTurnError as exc:
            log.warning("%s; its batch is redone", exc)
            self._rollback()

    def _end_batches(self, now_ms: int) -> dict[int, Batch]:
        """Close the batches of the partitions this batch touched. The others keep their
        empty batch open: ending and committing it would cost the same for each of them on
        every batch, so a replica with many partitions would pay per partition, not per record."""
        batches = {p: pp.end_batch(now_ms) for p, pp in self.partitions.items() if pp.has_work}
        for batch in batches.values():
            self.progress.add(batch.counters)
        return batches

    def _apply(self, batches: dict[int, Batch], delivered: list[Delivered]) -> None:
        reached = changelog_offsets(delivered, self.topics)
        for p in batches:
            self.partitions[p].committed(reached.get(p, {}))
        self._starts.pop(0)  # the oldest batch not yet committed was this one

    def _observe(self, step: Step, started: float, count: int) -> float:
        """Report one step to the metrics hook (and the progress totals); returns now."""
        now = self._clock.monotonic()
        self._report(step, now - started, count)
        return now

    def _report(self, step: Step, seconds: float, count: int) -> None:
        field = _PROGRESS_TIME.get(step)
        if field is not None:
            setattr(self.progress, field, getattr(self.progress, field) + seconds)
        self._metrics.observe(step, seconds, count)

    def _note_lag(self, positions: list[TopicPartition]) -> None:
        for tp in positions:
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                self.lag[(tp.topic, tp.partition)] = max(high - tp.offset, 0)

    def _consumed_positions(self) -> list[TopicPartition]:
        """The offset after the last record accepted into the batch, per input partition,
        naming this replica as their owner (kafka.fencing)."""
        return stamped(
            [TopicPartition(t, p, offset) for (t, p), offset in self._batch_next.items()],
            self._client_id,
            self._member,
        )

    def _abandon(self) -> None:
        """Drop the batches after an error that ends the loop; their input is redone by
        whoever owns the partitions next (a transaction still in flight is waited for: it
        commits or not, and a restore brings what it committed)."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            wait([flight.outcome])
        for pp in self.partitions.values():
            pp.rolled_back()
        self._starts.clear()
        self._batch_start.clear()
        self._batch_next.clear()
        if self._producer.in_transaction:
            try:
                self._producer.abort()
            except Exception as exc:  # the producer may be fenced or dead: it goes anyway
                log.warning("aborting the open transaction failed: %s", exc)

    def _rollback(self) -> None:
        """Drop every batch not yet committed (a later one was built on the earlier) and
        seek back to the first offset any of them took from each input partition."""
        for pp in self.partitions.values():
            pp.rolled_back()
        first: dict[tuple[str, int], int] = {}
        for starts in (*self._starts, self._batch_start):
            for tp, offset in starts.items():
                first[tp] = min(offset, first.get(tp, offset))
        for (topic, partition), offset in first.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:  # pragma: no cover - partition revoked meanwhile
                log.warning("seek %s[%d] failed: %s", topic, partition, exc)
        self._starts.clear()
        self._batch_start.clear()
        self._batch_next.clear()

    def _isolate(self, exc: InstanceTurnError | RecordHandlingError) -> None:
        """Abort path for one poisoned instance or record: abort the transaction, drop the
        batches, seek back, and have the partition's state machine fail that instance alone
        (or dead-letter that record) when the batch is done again."""
        t = self._clock.monotonic()
        self._settle_in_flight()  # an earlier batch still committing goes first
        self.progress.aborts += 1
        if self._producer.in_transaction:
            self._producer.abort()  # an error here is not the instance's: run_batch stops
        self._rollback()
        self._observe(Step.ABORT, t, 1)
        pp = self.partitions.get(exc.partition)
        if pp is None:  # the partition moved meanwhile: its next owner redoes the batch
            return
        if not pp.isolate(exc):
            raise BrokerRefusalError(
                f"{exc}, and again after failing it alone; this replica stops (check the "
                f"topics and the broker's limits)"
            ) from exc
        log.error("%s; it fails alone and the batch is done again", exc)

    # --- rebalancing -----------------------------------------------------------------------

    def _assigned(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        """Take the assignment and pause its new partitions; a thread of their own fences
        their departed owners and restores them (kafka.takeover) while the partitions this
        replica kept go on, and ``_adopt_takeovers`` opens them for work once restored."""
        taking = {p for t in self._takeovers for p in t.partitions}
        new = sorted({tp.partition for tp in assigned} - set(self.partitions) - taking)
        if uses_consumer_protocol(self.settings):
            consumer.incremental_assign(assigned)
        else:
            consumer.assign(assigned)
        if not new:
            self.ready = True
            return
        consumer.pause([tp for tp in assigned if tp.partition in new])
        # An eager rebalance revoked what this replica keeps too: those partitions' tables
        # are current and restore in no time, so they must not wait for the ones that moved.
        back = [p for p in new if p in self._held_before]
        moved = [p for p in new if p not in self._held_before]
        self._held_before = set()
        for partitions in (back, moved):
            if partitions:
                self._take_over(consumer, partitions)

    def _take_over(self, consumer: Consumer, new: list[int]) -> None:
        # the group is asked here, before the restore would wait for what they left open
        departed = self._fencing.departed(
            consumer, [TopicPartition(t, p) for t in self._inputs for p in new]
        )
        if self.standbys is not None:  # their warm copies become the processor's stores
            self.standbys.claim(new)
        fencing = self._fencing
        takeover = Takeover(
            new,
            fence=lambda: [fencing.fence(owner) for owner in sorted(departed)],
            open_partition=self._open_partition,
            restore=functools.partial(restore_partitions, self.settings, self.topics),
        )
        self._takeovers.append(takeover.start())

    def _adopt_takeovers(self) -> None:
        """Open the partitions whose takeover finished for work (between batches, on the
        processor's thread); a takeover that failed raises its error here, as a restore in
        the rebalance callback did."""
        for takeover in list(self._takeovers):
            done = takeover.finished()
            if done is None:
                continue
            self._takeovers.remove(takeover)
            if done.error is not None or done.report is None:
                for pp in done.partitions.values():
                    pp.close()
                self._unclaim(takeover.partitions)
                raise done.error or RuntimeError("a takeover ended without a report")
            self._adopt(done.partitions, done.report)

    def _adopt(self, opened: dict[int, PartitionProcessor], report: RestoreReport) -> None:
        self.progress.restores += 1
        self.progress.restored_records += report.records
        self.progress.restore_s += report.seconds
        self.progress.restore_waits += len(report.waits)
        self.progress.restore_wait_s += report.waited_s
        log.info(
            "partitions %s restored: %d changelog records in %.2fs%s",
            sorted(opened),
            report.records,
            report.seconds,
            f" ({report.waited_s:.1f}s waiting for open transactions)" if report.waits else "",
        )
        if self._count_statuses:
            for pp in opened.values():
                pp.count_statuses()
        self.partitions.update(opened)
        self._consumer.resume([TopicPartition(t, p) for t in self._inputs for p in opened])
        self.ready = True
        if self._on_assigned is not None:
            self._on_assigned(sorted(self.partitions))

    def _cancel_takeovers(self, gone: set[int] | None = None) -> list[int]:
        """Cancel the takeovers of partitions in ``gone`` (all when None); returns the
        partitions they held that are still assigned, to be taken over again."""
        kept: list[int] = []
        for takeover in list(self._takeovers):
            if gone is not None and not gone & set(takeover.partitions):
                continue
            self._takeovers.remove(takeover)
            takeover.cancel(CLOSE_S)
            self._unclaim(takeover.partitions)
            kept += [p for p in takeover.partitions if gone is not None and p not in gone]
        return kept

    def _revoked(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        if not self._failed:
            try:
                self._finish_in_flight()  # the batch in flight first, in order
            except InstanceTurnError as exc:  # the next owner redoes the batch and finds it
                log.error("%s; the batch is left to the partitions' next owner", exc)
                self._abandon()
        pending = any(not pp.batch.empty for pp in self.partitions.values()) or self._batch_start
        if pending and not self._failed:
            try:
                self._commit(self._clock.now_ms())
            except InstanceTurnError as exc:  # the next owner redoes the batch and finds it
                log.error("%s; the batch is left to the partitions' next owner", exc)
                self._abandon()
        elif pending:
            self._abandon()
        gone = {tp.partition for tp in revoked}
        self._held_before = gone & set(self.partitions)
        kept = self._cancel_takeovers(gone)
        if kept:
            self._take_over(consumer, kept)
        if gone & set(self.partitions):
            log.info("partitions %s revoked", sorted(gone & set(self.partitions)))
        for p in sorted(gone):
            pp = self.partitions.pop(p, None)
            if pp is not None:
                pp.close()
        self._unclaim(gone)
        self.lag = {tp: n for tp, n in self.lag.items() if tp[1] not in gone}

    def _unclaim(self, partitions: Collection[int]) -> None:
        """The partitions' stores are closed: the standbys may keep them warm again."""
        if self.standbys is not None:
            self.standbys.unclaim(partitions)

    def _partition_path(self, partition: int) -> Path:
        """A partition's database: the same folder whether this replica owns the partition
        or keeps a standby copy of it, so a takeover restores from where the copy is."""
        settings = self.settings
        return Path(settings.state_dir) / settings.namespace / settings.replica_id / f"p{partition}"

    def _open_partition(self, partition: int) -> PartitionProcessor:
        return PartitionProcessor(
            partition, RocksPartitionStore(self._partition_path(partition)), self.env
        )
