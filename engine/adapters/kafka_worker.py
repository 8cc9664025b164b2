"""The activity worker's Kafka loop: consume tasks, run them, produce results transactionally.

One consumer in the worker group on the activity-tasks topic (read_committed, cooperative
rebalancing, no auto-commit) and one transactional producer whose ``transactional.id`` is
``<namespace>.worker.<worker id>``. Each transaction carries a batch of results and dead
letters together with the task offsets they settle; it commits after ~50 ms or as soon as
the worker is idle, never once per task.

The loop never blocks on an activity: activities run in :class:`ActivityRunner` threads or
on its event loop, and while ``concurrency`` tasks are taken the partitions are paused but
still polled, so a long activity cannot push the consumer past ``max.poll.interval.ms``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from engine.adapters.kafka_admin import ensure_task_queue_topics
from engine.adapters.kafka_config import (
    consumer_config,
    group_membership,
    transactional_producer_config,
)
from engine.adapters.kafka_deadline import close_within, ends_process_if_stuck
from engine.adapters.kafka_io import (
    AbortedTransaction,
    RecordRejectedError,
    TransactionalProducer,
    leave_group,
    make_consumer,
    poll_batch,
    resume_partitions,
)
from engine.adapters.kafka_recovery import Recovery
from engine.adapters.metrics import WorkerMetrics
from engine.adapters.tracing import trace_header
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError
from engine.core.task_queues import DEFAULT_TASK_QUEUE
from engine.runtime.registry import Registry
from engine.services.queue_limits import QueueLimits
from engine.services.tracing import TraceHook
from engine.services.worker import (
    CommitPolicy,
    FlowAction,
    Outbound,
    TaskRecord,
    Worker,
)

__all__ = ["KafkaWorker", "run_loops", "worker_transactional_id"]

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.1
_BUSY_POLL_S = 0.002
_MAX_BATCH = 500
_RETRY_MAX_S = 5.0
#: How long the worker keeps retrying failed transactions (a broker outage) before it stops.
_RECOVERY_S = 300.0
_ERROR_LOG_EVERY_S = 30.0
#: How long closing may take (leaving the group) before the process ends itself.
CLOSE_S = 60.0


def worker_transactional_id(
    namespace: str, worker_id: str, task_queue: str = DEFAULT_TASK_QUEUE
) -> str:
    """Stable per worker id (and task queue: one loop per queue), so a restarted worker
    fences its previous incarnation."""
    base = f"{namespace}.worker.{worker_id}"
    return base if task_queue == DEFAULT_TASK_QUEUE else f"{base}.{task_queue}"


class KafkaWorker:
    """Runs activities for one worker process until ``stop`` is set (see :meth:`run`)."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        *,
        concurrency: int | None = None,
        prefetch: int | None = None,
        worker_id: str | None = None,
        commit_interval_s: float = 0.05,
        shutdown_timeout_s: float = 30.0,
        consumer_overrides: dict[str, Any] | None = None,
        metrics: WorkerMetrics | None = None,
        tracing: TraceHook | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        executor: str = "thread",
        queue_limits: QueueLimits | None = None,
    ) -> None:
        self.settings = settings
        self.topics = topic_names(settings.namespace)
        self.task_queue = task_queue
        #: The topic of the task queue this loop serves.
        self.source_topic = self.topics.task_queue(task_queue)
        self.worker_id = worker_id or settings.worker_id
        self.metrics = metrics or WorkerMetrics()
        self.worker = Worker(
            registry,
            source_topic=self.source_topic,
            concurrency=concurrency or settings.worker_concurrency,
            prefetch=prefetch,
            worker_id=self.worker_id,
            observer=self.metrics,
            tracing=tracing,
            task_queue=task_queue,
            executor=executor,
            queue_limits=queue_limits,
        )
        self.metrics.attach_worker(self.worker)
        self.policy = CommitPolicy(commit_interval_s)
        self.shutdown_timeout_s = shutdown_timeout_s
        self.consumer_overrides = dict(consumer_overrides or {})
        self.transactions = 0
        self.aborts = 0
        self.pauses = 0
        self._paused = False
        self._repause = False
        #: Partitions paused on their own (see _pause_crowded).
        self._crowded: set[int] = set()
        self._last_error_log = 0.0
        self._consumer: Consumer | None = None
        self._producer: TransactionalProducer | None = None
        self._stop = threading.Event()
        self._recovery = Recovery(f"worker {self.worker_id}")

    # --- wiring -----------------------------------------------------------------------------

    @property
    def _member_id(self) -> str:
        """The consumer's client id and static group member id: one per worker id and task
        queue, since a worker serving several queues runs one consumer per queue in the same
        group (two members under one ``group.instance.id`` would fence each other)."""
        return worker_transactional_id(self.settings.namespace, self.worker_id, self.task_queue)

    def _consumer_config(self) -> dict[str, Any]:
        s = self.settings
        return consumer_config(
            s.bootstrap_servers,
            s.worker_group,
            client_id=self._member_id,
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
                "max.poll.interval.ms": 300_000,
                **group_membership(self._member_id, static=s.static_membership),
                **s.extra_kafka,
                **self.consumer_overrides,
            },
        )

    def _producer_config(self, txn_id: str) -> dict[str, Any]:
        s = self.settings
        return transactional_producer_config(
            s.bootstrap_servers,
            txn_id,
            client_id=txn_id,
            transaction_timeout_ms=30_000,
            **{"linger.ms": 1, **s.extra_kafka},
        )

    def _new_producer(self) -> TransactionalProducer:
        """The worker's transactional producer; a new one fences the one before."""
        txn_id = worker_transactional_id(self.settings.namespace, self.worker_id, self.task_queue)
        return TransactionalProducer(self._producer_config(txn_id), txn_id)

    def _replace_producer(self) -> None:
        """A new producer after being fenced (stalled past the transaction timeout) or after
        one could not be recreated (no broker)."""
        old, self._producer = self._producer, None
        if old is not None:
            old.close()
        self._producer = self._new_producer()

    def _connect(self) -> None:
        partitions = ensure_task_queue_topics(self.settings, [self.task_queue])
        self.worker.source_partitions = partitions.get(self.source_topic, 1)
        self.worker.queue_limits.set_partitions(self.worker.source_partitions, self.task_queue)
        self._producer = self._new_producer()
        self._consumer = self._new_consumer()

    def _new_consumer(self) -> Consumer:
        return make_consumer(
            self._consumer_config(),
            [self.source_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None, "run() connects the consumer"
        return self._consumer

    @property
    def producer(self) -> TransactionalProducer:
        assert self._producer is not None, "run() connects the producer"
        return self._producer

    # --- main loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set, then shut down gracefully: stop taking tasks, wait up
        to ``shutdown_timeout_s`` for running ones, commit, leave the group."""
        self._stop = stop
        self._connect()
        log.info(
            "worker %s consuming %s (group %s, concurrency %d)",
            self.worker_id,
            self.source_topic,
            self.settings.worker_group,
            self.worker.concurrency,
        )
        try:
            while not stop.is_set():
                self.step()
            self._drain()
        finally:
            self._close()

    def step(self) -> None:
        """One round: poll, start tasks, send finished results, pause/resume, maybe commit."""
        records = self._poll()
        self._send(self.worker.accept(records))
        wait = _BUSY_POLL_S if self.worker.running and not records else 0.0
        self._send(self.worker.collect(wait))
        self._apply_flow()
        if self.policy.due(idle=self.worker.idle and not records):
            self._catch_up()
            self._commit()

    def _catch_up(self) -> None:
        """Let idle partitions commit the consumer's position (past transaction markers).
        Only here, between polls: inside a rebalance callback the consumer may have handed
        out records the worker has not taken yet."""
        assignment = self.consumer.assignment()
        if assignment:
            positions = self.consumer.position(assignment)
            self.worker.offsets.caught_up({tp.partition: tp.offset for tp in positions})

    def _poll(self) -> list[TaskRecord]:
        busy = self.worker.running > 0
        timeout = 0.0 if busy else (_BUSY_POLL_S if self.producer.in_transaction else _IDLE_POLL_S)
        limit = 1 if self._paused else min(max(self.worker.free, 1), _MAX_BATCH)
        consumer = self.consumer
        messages = poll_batch(consumer, limit, timeout)
        records = [r for r in (self._record(m) for m in messages) if r is not None]
        return records if self._consumer is consumer else []  # none of a replaced consumer

    def _record(self, message: Message) -> TaskRecord | None:
        error = message.error()
        if error is not None:
            if error.fatal() or error.code() == KafkaError._FATAL:  # the consumer is dead
                self._rejoin(BrokerError(f"the worker's consumer failed for good: {error}"))
                return None
            self._log_consumer_error(error)
            return None
        _, timestamp = message.timestamp()
        return TaskRecord(
            message.partition() or 0,
            message.offset() or 0,
            message.key(),
            message.value(),
            max(int(timestamp), 0),
            headers=trace_header(message.headers()) if self.worker.tracing.enabled else (),
        )

    def _log_consumer_error(self, error: KafkaError) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= _ERROR_LOG_EVERY_S or error.fatal():
            self._last_error_log = now
            hint = ""
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                hint = (
                    f" (create the engine's topics first: turnstile topics apply --namespace "
                    f"{self.settings.namespace})"
                )
            log.warning("consumer error on %s: %s%s", self.source_topic, error, hint)

    def _apply_flow(self) -> None:
        action = self.worker.flow(self._paused)
        if action is FlowAction.PAUSE:
            self.consumer.pause(self.consumer.assignment())
            self._paused = True
            self.pauses += 1
        elif action is FlowAction.RESUME:
            resume_partitions(self.consumer, self.consumer.assignment())
            self._paused = False
        elif self._paused and self._repause:
            self.consumer.pause(self.consumer.assignment())
        if action is not FlowAction.NONE or self._repause:
            self._crowded = set()  # every partition was just paused or resumed
        self._repause = False
        if not self._paused and self.worker.queue_limits.active:
            self._pause_crowded()

    def _pause_crowded(self) -> None:
        """Under a queue limit, pause each partition with enough tasks waiting: otherwise
        the prefetch fills up from a few partitions and the others' shares go unused."""
        crowded = self.worker.crowded_partitions()
        pause, resume = crowded - self._crowded, self._crowded - crowded
        if pause:
            self.consumer.pause([TopicPartition(self.source_topic, p) for p in pause])
        if resume:
            resume_partitions(self.consumer, [TopicPartition(self.source_topic, p) for p in resume])
        self._crowded = crowded

    # --- producing and committing -----------------------------------------------------------

    def _send(self, records: Iterable[Outbound]) -> None:
        records = list(records)
        if not records:
            return
        try:
            self._produce_all(records)
        except RecordRejectedError:
            raise  # a dead letter the producer refuses: no retry makes it fit
        except BrokerError as exc:  # aborted, fenced, or no producer while the broker is away
            self._recover(exc)

    def _produce_all(self, records: list[Outbound]) -> None:
        if not self.producer.in_transaction:
            self.producer.begin()
            self.policy.opened()
        for record in records:
            try:
                self._produce(record)
            except RecordRejectedError as exc:
                if record.dead:
                    raise
                self._produce(self.worker.replace_rejected(record, str(exc)))

    def _produce(self, record: Outbound) -> None:
        if record.requeue_to is not None:  # an unserved task back onto its own queue
            self.producer.produce(
                self.source_topic, record.key, record.value, record.requeue_to, record.headers
            )
            return
        topic = self.topics.dead_letters if record.dead else self.topics.activity_results
        self.producer.produce(topic, record.key, record.value, headers=record.headers or None)

    def _commit(self) -> None:
        offsets = self.worker.offsets.to_commit()
        if not offsets and not self.producer.in_transaction:
            return
        try:
            if not self.producer.in_transaction:
                self.producer.begin()
            positions = [TopicPartition(self.source_topic, p, o) for p, o in offsets.items()]
            self.producer.send_offsets(positions, self.consumer.consumer_group_metadata())
            self.producer.commit()
        except BrokerError as exc:  # aborted, fenced, or no producer while the broker is away
            self._recover(exc)
            return
        self.policy.closed()
        self.worker.committed(offsets)
        self.transactions += 1
        for p, offset in offsets.items():
            tp = TopicPartition(self.source_topic, p)
            _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                self.metrics.consumer_lag(p, high - offset, self.task_queue)

    def _recover(self, cause: BaseException) -> None:
        """After an abort: produce the worker's uncommitted output again in a new transaction
        (with backoff while the broker keeps refusing), so no finished task has to re-run.
        A fenced producer (the worker stalled past the transaction timeout) is replaced
        first, and so is one that could not be made again while the broker was away.

        Gives up with a BrokerError after ``_RECOVERY_S`` of failures (or when stopping):
        the uncommitted tasks are then redelivered to whichever worker owns them next.
        """
        self.aborts += 1
        self.policy.closed()
        delay, retries = 0.05, 0
        deadline = time.monotonic() + _RECOVERY_S
        log.warning("transaction failed (%s); producing its records again", cause)
        while True:
            time.sleep(delay)
            try:
                if not isinstance(cause, AbortedTransaction) or self._producer is None:
                    self._replace_producer()  # fenced, or left without a working producer
                if self.producer.in_transaction:
                    self.producer.abort()
                pending = self.worker.uncommitted()
                if pending:
                    self._produce_all(pending)
                if retries:
                    log.info("worker %s: transactions work again", self.worker_id)
                return
            except BrokerError as exc:  # aborted, fenced, or no broker to start a producer on
                cause, retries = exc, retries + 1
                self.aborts += 1
                if time.monotonic() >= deadline or self._stop.is_set():
                    raise BrokerError(
                        f"transactions keep failing ({exc}); the worker stops so that its "
                        f"tasks move to another worker. Check the brokers' health."
                    ) from exc
                delay = min(delay * 2, _RETRY_MAX_S)
                log.warning("retrying after another failure in %.2fs: %s", delay, exc)

    # --- rebalancing ------------------------------------------------------------------------

    def _rejoin(self, cause: BrokerError) -> None:
        """A consumer that failed for good (librdkafka's fatal errors; a static member can
        be fenced by its own rejoin after the coordinator restarted) is replaced, bounded by
        :class:`Recovery`: its partitions' unfinished tasks are dropped (their offsets were
        not committed, so whoever owns them next runs them) and a new consumer rejoins."""
        self._recovery.failed(cause)  # raises once the bounds are used up
        old, self._consumer = self.consumer, None
        self.worker.revoked(tp.partition for tp in old.assignment())
        if self.producer.in_transaction:
            self.producer.abort()
        close_within(f"closing the failed consumer of worker {self.worker_id}", old.close, 10.0)
        self._paused = False
        self._consumer = self._new_consumer()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", sorted(tp.partition for tp in partitions))
        self.worker.assigned(tp.partition for tp in partitions)
        self._repause = True

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what is settled before the partitions go; drop their unfinished tasks."""
        if consumer is not self._consumer:
            return  # a failed consumer being closed (``_rejoin`` dropped its partitions)
        log.info("revoked %s", sorted(tp.partition for tp in partitions))
        self._send(self.worker.collect())
        self._commit()
        self.worker.revoked(tp.partition for tp in partitions)
        self.metrics.partitions_dropped((tp.partition for tp in partitions), self.task_queue)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Lost partitions can no longer take offsets: abort and re-produce the rest."""
        if consumer is not self._consumer:
            return  # a failed consumer being closed (``_rejoin`` dropped its partitions)
        log.warning("lost %s", sorted(tp.partition for tp in partitions))
        self.worker.revoked(tp.partition for tp in partitions)
        if self.producer.in_transaction:
            self.producer.abort()
            self._recover(AbortedTransaction("partitions were lost"))

    # --- shutdown ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Stop taking tasks, let running ones finish (bounded), commit."""
        self.consumer.pause(self.consumer.assignment())
        self._paused = True
        dropped = self.worker.drop_backlog()
        deadline = time.monotonic() + self.shutdown_timeout_s
        while self.worker.running and time.monotonic() < deadline:
            self.consumer.poll(0.0)
            self._send(self.worker.collect(0.05))
        self._send(self.worker.collect())
        self._commit()
        if self.worker.running or dropped:
            log.warning(
                "stopping with %d running and %d queued task(s) unfinished; they will be "
                "redelivered to another worker",
                self.worker.running,
                dropped,
            )

    def _close(self) -> None:
        with ends_process_if_stuck(f"stopping worker {self.worker_id}", CLOSE_S):
            if self._consumer is not None:
                try:
                    leave_group(self._consumer)  # hand the partitions over now (static member)
                except Exception as exc:  # the revocation failed: closing still has to happen
                    log.warning("leaving the consumer group failed: %s", exc)
                try:
                    self._consumer.close()
                except Exception as exc:  # closing must not hide the error that ended the loop
                    log.warning("closing the consumer failed: %s", exc)
            if self._producer is not None:
                try:
                    self._producer.close()
                except Exception as exc:
                    log.warning("closing the producer failed: %s", exc)
        self.worker.shutdown()


def run_loops(workers: list[KafkaWorker], stop: threading.Event) -> None:
    """Run one loop per task queue until ``stop`` is set. Each queue has its own consumer
    and transactional producer, so a busy queue never holds up another; if one loop
    fails, the others stop too and the first error is raised."""
    if len(workers) == 1:
        workers[0].run(stop)
        return
    errors: list[BaseException] = []

    def run(worker: KafkaWorker) -> None:
        try:
            worker.run(stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=run, args=(w,), name=f"worker-{w.task_queue}") for w in workers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)  # the main thread keeps handling signals meanwhile
    if errors:
        raise errors[0]
