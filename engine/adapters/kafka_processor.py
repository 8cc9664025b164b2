"""The processor's Kafka loop: batches of turns, each committed in one transaction.

Per batch: consume from the assigned input partitions (read_committed), route every record
to its partition's :class:`PartitionProcessor`, fire due timers, then produce everything the
batch decided (history, changelogs, status, activity tasks, instance messages, dead letters)
together with the consumed offsets in ONE transaction. Only when the commit succeeds are the
table changes written to RocksDB, with the changelog offsets they reached; an abort drops
them and seeks the consumer back, so the batch is simply done again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from engine.adapters.kafka_config import consumer_config, transactional_producer_config
from engine.adapters.kafka_io import (
    AbortedTransaction,
    Delivered,
    TransactionalProducer,
    poll_batch,
)
from engine.adapters.kafka_isolation import Produced, produce_batch, refused_in_delivery
from engine.adapters.rocks_store import RocksPartitionStore
from engine.codec import decode_message
from engine.core.errors import (
    BrokerError,
    CodecError,
    InstanceTurnError,
    RecordHandlingError,
    TurnstileError,
)
from engine.core.failure import failure_from_exception
from engine.core.keys import murmur2_partition
from engine.core.messages import (
    COMMAND_TYPES,
    ActivityResult,
    ChildResult,
    RaiseEvent,
    StartWorkflow,
    TerminateWorkflow,
)
from engine.core.messages import (
    Message as EngineMessage,
)
from engine.runtime.registry import Registry
from engine.services.config import Settings
from engine.services.processor.partition import Counters, Environment, PartitionProcessor
from engine.services.topics import TopicNames, topic_max_message_bytes, topic_names
from engine.services.watchdog import TurnWatchdog

log = logging.getLogger("engine.processor")

STATE = "state"
TIMER = "timer"

#: Low fetch wait for latency; a short session so a crashed replica's partitions move on
#: quickly; heartbeats well inside it.
PROCESSOR_CONSUMER = {
    "fetch.wait.max.ms": 10,
    "max.poll.interval.ms": 300_000,
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1_000,
}


@dataclass
class Progress(Counters):
    """A replica's totals: its partitions' counters, its transactions, and where the time
    went (seconds), for progress lines and benchmarks."""

    transactions: int = 0
    aborts: int = 0
    outputs: int = 0
    turn_s: float = 0.0
    produce_s: float = 0.0
    offsets_s: float = 0.0
    commit_s: float = 0.0

    def add(self, counters: Counters) -> None:
        for f in fields(Counters):
            setattr(self, f.name, getattr(self, f.name) + getattr(counters, f.name))


class ProcessorRunner:
    """One processor replica: owns the partitions the consumer group assigns it."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        *,
        on_assigned: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topics: TopicNames = topic_names(settings.namespace)
        self.env = Environment(
            registry=registry,
            topics=self.topics,
            pending_events_max=settings.pending_events_max,
            pending_events_ttl_ms=settings.pending_events_ttl_ms,
            # the cache budget is per replica; each partition gets its share
            cache_capacity=max(100, settings.cache_instances // max(1, settings.partitions)),
            limits=settings.limits,
            watchdog=TurnWatchdog(settings.turn_budget_ms),
            turn_max_events=settings.turn_max_events,
        )
        self.partitions: dict[int, PartitionProcessor] = {}
        self.progress = Progress()
        self._on_assigned = on_assigned
        self._accepts = _accepted_kinds(self.topics)
        self._num_partitions = settings.partitions
        self._batch_start: dict[tuple[str, int], int] = {}
        #: The offset after the last record routed, per input partition: what the batch
        #: commits (not the consumer's position, which may already be past records fetched
        #: but not routed when a revocation commits mid-batch).
        self._batch_next: dict[tuple[str, int], int] = {}
        #: Set once a batch failed beyond repair: nothing may be committed after it.
        self._failed = False
        client_id = f"{settings.namespace}.processor.{settings.replica_id}"
        consumer = consumer_config(
            settings.bootstrap_servers, settings.processor_group, client_id=client_id
        )
        consumer.update(PROCESSOR_CONSUMER)
        self._consumer = Consumer(consumer)
        producer = transactional_producer_config(
            settings.bootstrap_servers, client_id, transaction_timeout_ms=10_000
        )
        producer.update(
            {"linger.ms": 1, "message.max.bytes": topic_max_message_bytes(settings)}
            | settings.extra_kafka
        )
        self._producer = TransactionalProducer(producer, client_id)

    # --- lifecycle --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        inputs = [self.topics.commands, self.topics.activity_results, self.topics.instance_messages]
        self._consumer.subscribe(inputs, on_assign=self._assigned, on_revoke=self._revoked)
        log.info("processor %s consuming %s", self.settings.replica_id, ", ".join(inputs))
        try:
            while not stop.is_set():
                self.run_batch()
        finally:
            self.close()

    def close(self) -> None:
        log.info("processor %s stopping: %s", self.settings.replica_id, self.progress)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:  # pragma: no cover - best effort
            log.warning("closing consumer: %s", exc)
        for pp in self.partitions.values():
            pp.close()
        self.partitions.clear()
        self._producer.close()
        self.env.watchdog.close()

    # --- one batch ---------------------------------------------------------------------------

    def run_batch(self) -> int:
        """One batch; a poisoned instance or record is isolated and the batch redone.

        Any other error abandons the batch before it leaves (so closing the consumer can
        never commit half of it) and stops the replica.
        """
        try:
            return self._run_batch()
        except (InstanceTurnError, RecordHandlingError) as exc:
            self._isolate(exc)
            return 0
        except BaseException:
            self._failed = True
            self._abandon()
            raise

    def _run_batch(self) -> int:
        """Consume until the batch is full, old or idle; commit it. Returns records seen.

        The first wait ends as soon as one record arrives (``poll_batch``); after that only
        what is already fetched is drained, so a lone record is not held back waiting for
        company.
        """
        budget = self.settings.max_batch_ms / 1000
        started = time.monotonic()
        count = 0
        messages = poll_batch(self._consumer, self.settings.max_batch, self._idle_wait())
        while messages:
            now_ms = int(time.time() * 1000)
            for message in messages:
                self._route(message, now_ms)
            count += len(messages)
            if count >= self.settings.max_batch or time.monotonic() - started >= budget:
                break
            messages = self._consumer.consume(self.settings.max_batch - count, 0)
        now_ms = int(time.time() * 1000)
        fired = sum(pp.fire_due_timers(now_ms) for pp in self.partitions.values())
        if count or fired:
            self._commit(now_ms)
        return count

    def _idle_wait(self) -> float:
        """How long to block for input: until the next timer is due, at most 50 ms."""
        return 0.05

    def _route(self, message: Message, now_ms: int) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", error)
            return
        topic, partition = message.topic() or "", message.partition() or 0
        offset = message.offset() or 0
        self._batch_start.setdefault((topic, partition), offset)
        pp = self.partitions.get(partition)
        if pp is None:  # pragma: no cover - librdkafka only delivers assigned partitions
            return
        self._batch_next[(topic, partition)] = offset + 1
        key, value = message.key(), message.value()
        ts = message.timestamp()[1]
        try:
            decoded = self._validate(topic, partition, key, value)
            failed = pp.quarantine.take_record(topic, offset)
            if failed is not None:
                pp.dead_letter(
                    f"handling it failed: {failed.stack or failed}", topic, offset, key, value, ts
                )
                return
            pp.handle(decoded, now_ms)
        except TurnstileError as exc:
            pp.dead_letter(str(exc), topic, offset, key, value, ts)
        except Exception as exc:  # a bug: redo the batch with this record in dead letters
            details = failure_from_exception(exc, retryable=False)
            raise RecordHandlingError(topic, partition, offset, details) from exc

    def _validate(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None
    ) -> EngineMessage:
        if value is None:
            raise CodecError("record has no value (tombstones are not accepted on input topics)")
        decoded = decode_message(value)
        if type(decoded) not in self._accepts[topic]:
            raise CodecError(f"{decoded.KIND} records are not accepted on topic {topic}")
        if key != decoded.instance_id.encode():
            raise CodecError(
                f"record key {key!r} does not match its instance id {decoded.instance_id!r}; "
                f"key every record by its instance id (UTF-8)"
            )
        expected = murmur2_partition(key, self._num_partitions)
        if expected != partition:
            raise CodecError(
                f"record for {decoded.instance_id!r} is on partition {partition} but murmur2 "
                f"gives {expected}: configure the producer with the murmur2 partitioner"
            )
        return decoded

    # --- transactions --------------------------------------------------------------------

    def _commit(self, now_ms: int) -> None:
        t0 = time.perf_counter()
        outputs: list[Produced] = []
        changes = {}
        for p, pp in self.partitions.items():
            out, ch = pp.end_batch(now_ms)
            outputs.extend((p, r) for r in out)
            changes[p] = ch
            self.progress.add(pp.counters)
            pp.counters = Counters()
        offsets = self._consumed_positions()
        if not outputs and not offsets:
            return
        progress = self.progress
        t1 = time.perf_counter()
        progress.turn_s += t1 - t0
        progress.outputs += len(outputs)
        try:
            self._producer.begin()
            produce_batch(self._producer, outputs, self.env.limits.record)
            t2 = time.perf_counter()
            if offsets:
                self._producer.send_offsets(offsets, self._consumer.consumer_group_metadata())
            t3 = time.perf_counter()
            delivered = self._producer.commit()
            progress.produce_s += t2 - t1
            progress.offsets_s += t3 - t2
            progress.commit_s += time.perf_counter() - t3
        except AbortedTransaction as exc:
            refused = refused_in_delivery(self._producer, outputs)
            if refused is not None:
                raise refused from exc
            log.warning("transaction aborted, redoing the batch: %s", exc)
            self.progress.aborts += 1
            self._rollback()
            return
        except InstanceTurnError:
            raise  # run_batch aborts the transaction and redoes the batch without it
        except BaseException:
            # Anything else stops the replica. Forget the batch first: closing the consumer
            # runs the revocation callback, which would otherwise commit the batch's input
            # offsets without its output (or fail on the open transaction and hide this error).
            self._abandon()
            raise
        self.progress.transactions += 1
        reached = self._changelog_offsets(delivered)
        for p, pp in self.partitions.items():
            pp.committed(changes.get(p, {}), reached.get(p, {}))
        self._batch_start.clear()
        self._batch_next.clear()

    def _consumed_positions(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, offset) for (t, p), offset in self._batch_next.items()]

    def _changelog_offsets(self, delivered: list[Delivered]) -> dict[int, dict[str, int]]:
        names = {self.topics.state_changelog: STATE, self.topics.timer_changelog: TIMER}
        reached: dict[int, dict[str, int]] = defaultdict(dict)
        for d in delivered:
            name = names.get(d.topic)
            if name is not None and d.offset > reached[d.partition].get(name, -1):
                reached[d.partition][name] = d.offset
        return reached

    def _abandon(self) -> None:
        """Drop the batch after an error that ends the loop; its input is redone by whoever
        owns the partitions next."""
        for pp in self.partitions.values():
            pp.rolled_back()
        self._batch_start.clear()
        self._batch_next.clear()
        if self._producer.in_transaction:
            try:
                self._producer.abort()
            except Exception as exc:  # the producer may be fenced or dead: it goes anyway
                log.warning("aborting the open transaction failed: %s", exc)

    def _isolate(self, exc: InstanceTurnError | RecordHandlingError) -> None:
        """Quarantine what failed and redo the batch (nothing of this try is committed)."""
        pp = self.partitions.get(exc.partition)
        if pp is None:  # the partition moved meanwhile: its next owner redoes the batch
            self._abandon()
            return
        if isinstance(exc, InstanceTurnError):
            fresh = pp.quarantine.add_instance(exc.instance_id, exc.details)
        else:
            fresh = pp.quarantine.add_record(exc.topic, exc.offset, exc.details)
        if not fresh:
            self._failed = True
            self._abandon()
            raise BrokerError(
                f"{exc}, and again after failing it alone; this replica stops (check the "
                f"topics and the broker's limits)"
            ) from exc
        log.error("%s; it fails alone and the batch is done again", exc)
        self.progress.aborts += 1
        try:
            if self._producer.in_transaction:
                self._producer.abort()
        except BaseException:
            self._failed = True
            self._abandon()
            raise
        self._rollback()

    def _rollback(self) -> None:
        for pp in self.partitions.values():
            pp.rolled_back()
        for (topic, partition), offset in self._batch_start.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:  # pragma: no cover - partition revoked meanwhile
                log.warning("seek %s[%d] failed: %s", topic, partition, exc)
        self._batch_start.clear()
        self._batch_next.clear()

    # --- rebalancing -----------------------------------------------------------------------

    def _assigned(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        new = sorted({tp.partition for tp in assigned} - set(self.partitions))
        for p in new:
            self.partitions[p] = self._open_partition(p)
        if self._on_assigned is not None:
            self._on_assigned(sorted(self.partitions))

    def _revoked(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        pending = any(pp.batch for pp in self.partitions.values()) or self._batch_start
        if pending and not self._failed:
            try:
                self._commit(int(time.time() * 1000))
            except InstanceTurnError as exc:  # the next owner redoes the batch and finds it
                log.error("%s; the batch is left to the partitions' next owner", exc)
                self._abandon()
        elif pending:
            self._abandon()
        for p in sorted({tp.partition for tp in revoked}):
            pp = self.partitions.pop(p, None)
            if pp is not None:
                pp.close()

    def _open_partition(self, partition: int) -> PartitionProcessor:
        path = (
            Path(self.settings.state_dir)
            / self.settings.namespace
            / self.settings.replica_id
            / f"p{partition}"
        )
        store = RocksPartitionStore(path)
        pp = PartitionProcessor(partition, store, self.env)
        restore_partition(self.settings, self.topics, pp)
        return pp


def restore_partition(settings: Settings, topics: TopicNames, pp: PartitionProcessor) -> int:
    """Bring a partition's tables up to its changelogs' end before it processes anything."""
    started = time.monotonic()
    total = 0
    for topic, name in ((topics.state_changelog, STATE), (topics.timer_changelog, TIMER)):
        total += _restore_one(settings, topic, name, pp)
    log.info(
        "partition %d restored: %d changelog records in %.2fs",
        pp.partition,
        total,
        time.monotonic() - started,
    )
    return total


def _restore_one(settings: Settings, topic: str, name: str, pp: PartitionProcessor) -> int:
    recorded = pp.tables.recorded_offset(name)
    start = OFFSET_BEGINNING if recorded is None else recorded + 1
    config = consumer_config(settings.bootstrap_servers, f"{settings.namespace}.restore")
    config.update({"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    consumer = Consumer(config)
    restored = 0
    try:
        low, high = _watermarks(consumer, TopicPartition(topic, pp.partition))
        if recorded is not None and recorded + 1 < low:
            raise TurnstileError(
                f"local state of partition {pp.partition} is older than the changelog "
                f"{topic} retains; delete {settings.state_dir} for this replica and restart"
            )
        if high <= (0 if recorded is None else recorded + 1):
            return 0
        consumer.assign([TopicPartition(topic, pp.partition, start)])
        restored = _drain(consumer, pp, name)
    finally:
        consumer.close()
    return restored


def _watermarks(consumer: Consumer, tp: TopicPartition, attempts: int = 5) -> tuple[int, int]:
    """Low and high watermark, retried: a busy or just-elected leader may not answer at once."""
    for attempt in range(attempts):
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(low), int(high)
        except KafkaException as exc:
            if attempt == attempts - 1:
                raise TurnstileError(
                    f"cannot read the offsets of {tp.topic}[{tp.partition}]: {exc}; check that "
                    f"the broker is reachable and the topics exist (topics apply)"
                ) from exc
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _drain(consumer: Consumer, pp: PartitionProcessor, name: str) -> int:
    restored = 0
    batch: dict[bytes, bytes | None] = {}
    last = -1
    while True:
        # consume() waits for its whole timeout unless it fills the batch, even after the
        # partition-EOF event: a short timeout keeps a restore from costing a second each.
        messages = consumer.consume(5000, 0.05)
        done = False
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done = True
                    continue
                raise TurnstileError(f"restoring partition {pp.partition}: {err}")
            batch[m.key() or b""] = m.value()
            last = m.offset() or 0
            restored += 1
        if batch and (len(batch) >= 50_000 or done):
            pp.tables.apply(batch, {name: last})
            batch = {}
            if not done:
                log.info("restoring partition %d: %d %s records", pp.partition, restored, name)
        if done:
            return restored


def _accepted_kinds(topics: TopicNames) -> dict[str, frozenset[type]]:
    return {
        topics.commands: frozenset(COMMAND_TYPES),
        topics.activity_results: frozenset({ActivityResult}),
        topics.instance_messages: frozenset(
            {StartWorkflow, RaiseEvent, ChildResult, TerminateWorkflow}
        ),
    }
