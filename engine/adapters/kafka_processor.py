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
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from engine.adapters.kafka_config import consumer_config, transactional_producer_config
from engine.adapters.kafka_deadline import ends_process_if_stuck
from engine.adapters.kafka_io import (
    AbortedTransaction,
    Delivered,
    TransactionalProducer,
    poll_batch,
)
from engine.adapters.kafka_restore import restore_tables
from engine.adapters.metrics import PHASES, ProcessorMetrics
from engine.adapters.rocks_store import RocksPartitionStore
from engine.codec import decode_message
from engine.core.errors import CodecError, TurnstileError
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
from engine.services.topics import TopicNames, topic_names

log = logging.getLogger("engine.processor")

STATE = "state"
TIMER = "timer"
#: How long closing may take (leaving the group, a last commit) before the process ends itself.
CLOSE_S = 60.0

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
    restored_records: int = 0
    restore_s: float = 0.0
    #: changelog partitions whose restore had to wait for an open transaction, and how long
    restore_waits: int = 0
    restore_wait_s: float = 0.0

    def add(self, counters: Counters) -> None:
        for f in fields(Counters):
            value = getattr(counters, f.name)
            if isinstance(value, int):  # the labelled tallies go to the metrics only
                setattr(self, f.name, getattr(self, f.name) + value)


class ProcessorRunner:
    """One processor replica: owns the partitions the consumer group assigns it."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        *,
        on_assigned: Callable[[list[int]], None] | None = None,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or ProcessorMetrics()
        self.topics: TopicNames = topic_names(settings.namespace)
        self.env = Environment(
            registry=registry,
            topics=self.topics,
            pending_events_max=settings.pending_events_max,
            pending_events_ttl_ms=settings.pending_events_ttl_ms,
            # the cache budget is per replica; each partition gets its share
            cache_capacity=max(100, settings.cache_instances // max(1, settings.partitions)),
        )
        self.partitions: dict[int, PartitionProcessor] = {}
        self.progress = Progress()
        self._on_assigned = on_assigned
        self._accepts = _accepted_kinds(self.topics)
        self._num_partitions = settings.partitions
        self._batch_start: dict[tuple[str, int], int] = {}
        self._stop: threading.Event | None = None
        client_id = f"{settings.namespace}.processor.{settings.replica_id}"
        consumer = consumer_config(
            settings.bootstrap_servers, settings.processor_group, client_id=client_id
        )
        consumer.update(PROCESSOR_CONSUMER)
        self._consumer = Consumer(consumer)
        producer = transactional_producer_config(
            settings.bootstrap_servers, client_id, transaction_timeout_ms=10_000
        )
        producer.update({"linger.ms": 1, **settings.extra_kafka})
        self._producer = TransactionalProducer(producer, client_id)

    # --- lifecycle --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
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
        with ends_process_if_stuck(f"stopping processor {self.settings.replica_id}", CLOSE_S):
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:  # pragma: no cover - best effort
                log.warning("closing consumer: %s", exc)
            for pp in self.partitions.values():
                pp.close()
            self.partitions.clear()
            self._producer.close()

    # --- one batch ---------------------------------------------------------------------------

    def run_batch(self) -> int:
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
        pp = self.partitions.get(partition)
        if pp is None:  # pragma: no cover - a partition that is not restored is paused
            return
        self._batch_start.setdefault((topic, partition), offset)
        self.metrics.record_in(topic)
        key, value = message.key(), message.value()
        ts = message.timestamp()[1]
        try:
            decoded = self._validate(topic, partition, key, value)
            pp.handle(decoded, now_ms)
        except TurnstileError as exc:
            pp.dead_letter(str(exc), topic, offset, key, value, ts, kind=type(exc).__name__)

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
        outputs = []
        changes = {}
        for p, pp in self.partitions.items():
            out, ch = pp.end_batch(now_ms)
            outputs.extend(out)
            changes[p] = ch
            self.progress.add(pp.counters)
            self.metrics.partition_batch(p, pp.counters, pp.cache)
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
            for r in outputs:
                self._producer.produce(r.topic, r.key, r.value, r.partition, r.headers)
            t2 = time.perf_counter()
            if offsets:
                self._producer.send_offsets(offsets, self._consumer.consumer_group_metadata())
            t3 = time.perf_counter()
            delivered = self._producer.commit()
            t4 = time.perf_counter()
            progress.produce_s += t2 - t1
            progress.offsets_s += t3 - t2
            progress.commit_s += t4 - t3
        except AbortedTransaction as exc:
            log.warning("transaction aborted, redoing the batch: %s", exc)
            self.progress.aborts += 1
            self.metrics.abort()
            self._rollback()
            return
        except BaseException:
            # Anything else stops the replica. Forget the batch first: closing the consumer
            # runs the revocation callback, which would otherwise commit the batch's input
            # offsets without its output (or fail on the open transaction and hide this error).
            self._abandon()
            raise
        self.progress.transactions += 1
        self._observe(offsets, len(outputs), (t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        reached = self._changelog_offsets(delivered)
        for p, pp in self.partitions.items():
            moved = pp.committed(changes.get(p, {}), reached.get(p, {}))
            if moved and pp.status_counts is not None:
                self.metrics.instance_statuses(p, pp.status_counts)
        self._batch_start.clear()

    def _observe(
        self, offsets: list[TopicPartition], outputs: int, seconds: tuple[float, ...]
    ) -> None:
        """Metrics of a committed batch: timings, size, and each input partition's lag (the
        high watermark from the last fetch, no broker round trip)."""
        m = self.metrics
        m.turn(seconds[0])
        for name, s in zip(PHASES, seconds[1:], strict=True):
            m.phase(name, s)
        m.batch(outputs)
        for tp in offsets:
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                m.consumer_lag(tp.topic, tp.partition, high - tp.offset)

    def _consumed_positions(self) -> list[TopicPartition]:
        if not self._batch_start:
            return []
        wanted = [TopicPartition(t, p) for (t, p) in self._batch_start]
        return [tp for tp in self._consumer.position(wanted) if tp.offset >= 0]

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
        if self._producer.in_transaction:
            try:
                self._producer.abort()
            except Exception as exc:  # the producer may be fenced or dead: it goes anyway
                log.warning("aborting the open transaction failed: %s", exc)

    def _rollback(self) -> None:
        for pp in self.partitions.values():
            pp.rolled_back()
        for (topic, partition), offset in self._batch_start.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:  # pragma: no cover - partition revoked meanwhile
                log.warning("seek %s[%d] failed: %s", topic, partition, exc)
        self._batch_start.clear()

    # --- rebalancing -----------------------------------------------------------------------

    def _assigned(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        new = sorted({tp.partition for tp in assigned} - set(self.partitions))
        opened = {p: self._open_partition(p) for p in new}
        try:
            self._restore(opened)
        except BaseException:
            # Never process a partition whose tables are short of the committed end.
            for pp in opened.values():
                pp.close()
            consumer.pause([tp for tp in assigned if tp.partition in opened])
            raise
        self.partitions.update(opened)
        self.metrics.partitions_owned(sorted(self.partitions))
        if self.metrics.count_instances:
            for p, pp in opened.items():
                pp.count_statuses()
                self.metrics.instance_statuses(p, pp.status_counts or {})
        if self._on_assigned is not None:
            self._on_assigned(sorted(self.partitions))

    def _revoked(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        if any(pp.batch for pp in self.partitions.values()) or self._batch_start:
            self._commit(int(time.time() * 1000))
        for p in sorted({tp.partition for tp in revoked}):
            pp = self.partitions.pop(p, None)
            if pp is not None:
                pp.close()
        self.metrics.partitions_owned(sorted(self.partitions))

    def _open_partition(self, partition: int) -> PartitionProcessor:
        path = (
            Path(self.settings.state_dir)
            / self.settings.namespace
            / self.settings.replica_id
            / f"p{partition}"
        )
        return PartitionProcessor(partition, RocksPartitionStore(path), self.env)

    def _restore(self, opened: dict[int, PartitionProcessor]) -> None:
        """Read every changelog of the new partitions to its committed end (kafka_restore)."""
        if not opened:
            return
        changelogs = [(self.topics.state_changelog, STATE), (self.topics.timer_changelog, TIMER)]
        report = restore_tables(
            self.settings,
            {p: changelogs for p in opened},
            {p: pp.tables for p, pp in opened.items()},
            stop=self._stop,
        )
        self.progress.restored_records += report.records
        self.progress.restore_s += report.seconds
        self.progress.restore_waits += len(report.waits)
        self.progress.restore_wait_s += report.waited_s
        self.metrics.restored_partitions(report.records, report.seconds)
        log.info(
            "partitions %s restored: %d changelog records in %.2fs%s",
            sorted(opened),
            report.records,
            report.seconds,
            f" ({report.waited_s:.1f}s waiting for open transactions)" if report.waits else "",
        )


def _accepted_kinds(topics: TopicNames) -> dict[str, frozenset[type]]:
    return {
        topics.commands: frozenset(COMMAND_TYPES),
        topics.activity_results: frozenset({ActivityResult}),
        topics.instance_messages: frozenset(
            {StartWorkflow, RaiseEvent, ChildResult, TerminateWorkflow}
        ),
    }
