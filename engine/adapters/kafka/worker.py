"""The activity worker's Kafka loop: consume tasks, run them, produce results, commit after.

One consumer in the worker group on the task-queue topic (read_committed, cooperative
rebalancing, no auto-commit) and one idempotent producer (``acks=all``, no transactions).
A result is produced the moment its activity finishes and is visible to the processor as
soon as the broker has it; no transaction holds it back. The consumer's offsets are
committed afterwards, per partition, up to the lowest task that is not settled (still
running, or with a record whose delivery was not acknowledged): after ~100 ms, or as soon
as the worker is idle. A record whose delivery fails is produced again (with backoff) and
its task's offset stays uncommitted until it is delivered. A crash re-runs the tasks after
the last commit, and the processor drops the second result of an attempt.

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

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from engine.adapters.kafka.admin import ensure_task_queue_topics
from engine.adapters.kafka.config import (
    consumer_config,
    group_membership,
    idempotent_producer_config,
)
from engine.adapters.kafka.deadline import close_within, ends_process_if_stuck
from engine.adapters.kafka.delivery import DeliveryProducer, Outcome, is_refusal
from engine.adapters.kafka.io import (
    LeaderCache,
    RecordRejectedError,
    leave_group,
    make_consumer,
    poll_batch,
    resume_partitions,
)
from engine.adapters.kafka.payloads import payload_store
from engine.adapters.kafka.recovery import Recovery
from engine.adapters.metrics import WorkerMetrics
from engine.adapters.tracing import trace_header
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError
from engine.core.task_queues import DEFAULT_TASK_QUEUE
from engine.runtime.registry import Registry
from engine.services.large_payloads import PayloadOffloader
from engine.services.tracing import TraceHook
from engine.services.worker.queue_limits import QueueLimits
from engine.services.worker.worker import (
    REQUEUES_HEADER,
    CommitPolicy,
    FlowAction,
    Outbound,
    TaskRecord,
    Worker,
)

__all__ = ["KafkaWorker", "run_loops", "worker_member_id"]

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.1
_BUSY_POLL_S = 0.002
_MAX_BATCH = 500
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 5.0
#: How long the worker keeps producing records again that fail to be delivered (a broker
#: outage) before it stops, so that its tasks move to another worker.
_RECOVERY_S = 300.0
#: How long one delivery may take, librdkafka's own retries included, before it is
#: reported as failed (and produced again).
_DELIVERY_TIMEOUT_MS = 60_000
#: How long a revocation waits for outstanding deliveries before it commits what settled.
_REVOKE_FLUSH_S = 10.0
#: How long a worker that lost its partitions waits for the group to give it some again
#: before it replaces its consumer (twice the session timeout: a rebalance has had time).
_LEFT_OUT_S = 20.0
_ERROR_LOG_EVERY_S = 30.0
#: How long closing may take (leaving the group) before the process ends itself.
CLOSE_S = 60.0


def _task_headers(headers: Any, traced: bool) -> tuple[tuple[str, bytes], ...]:
    """What the worker reads of a task record's headers: how often it went back to its
    queue unserved (the requeue delay and the note that says where a copy is depend on
    it) and, with tracing on, its ``traceparent``."""
    requeues = tuple(
        (name, value)
        for name, value in headers or ()
        if name == REQUEUES_HEADER and isinstance(value, bytes)
    )
    return (trace_header(headers) if traced else ()) + requeues


def worker_member_id(namespace: str, worker_id: str, task_queue: str = DEFAULT_TASK_QUEUE) -> str:
    """The consumer's client id and static group member id: stable per worker id (and task
    queue: one loop per queue), so a restarted worker takes its predecessor's place."""
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
        commit_interval_s: float = 0.1,
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
        #: Offset commits sent, deliveries that failed (their records were produced again)
        #: and pauses.
        self.commits = self.redeliveries = self.pauses = 0
        self._paused = self._repause = False
        #: When the consumer last lost its partitions with none assigned since (monotonic).
        self._lost_at: float | None = None
        #: Partitions paused on their own (see _pause_crowded).
        self._crowded: set[int] = set()
        self._last_error_log = 0.0
        self._consumer: Consumer | None = None
        self._producer: DeliveryProducer | None = None
        #: The task partitions' leaders, for the wake-up after a resume.
        self._leaders = LeaderCache()
        self._stop = threading.Event()
        self._recovery = Recovery(f"worker {self.worker_id}")
        #: Since when deliveries keep failing (None: the last one worked), the current
        #: retry delay, and when the records to produce again are due.
        self._failing_since: float | None = None
        self._retry_s = _RETRY_FIRST_S
        self._redo_at = 0.0
        #: A dead letter the broker refused for good: raised from the loop.
        self._refused: RecordRejectedError | None = None

    # --- wiring -----------------------------------------------------------------------------

    @property
    def _member_id(self) -> str:
        """The consumer's client id and static group member id: one per worker id and task
        queue, since a worker serving several queues runs one consumer per queue in the same
        group (two members under one ``group.instance.id`` would fence each other)."""
        return worker_member_id(self.settings.namespace, self.worker_id, self.task_queue)

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
                "on_commit": self._on_commit,
            },
        )

    def _new_producer(self) -> DeliveryProducer:
        s = self.settings
        config = idempotent_producer_config(
            s.bootstrap_servers,
            client_id=self._member_id,
            **{"linger.ms": 1, "message.timeout.ms": _DELIVERY_TIMEOUT_MS, **s.extra_kafka},
        )
        return DeliveryProducer(config, self._member_id)

    def _connect(self) -> None:
        partitions = ensure_task_queue_topics(self.settings, [self.task_queue])
        self.worker.source_partitions = partitions.get(self.source_topic, 1)
        self.worker.queue_limits.set_partitions(self.worker.source_partitions, self.task_queue)
        self._producer = self._new_producer()
        self._consumer = self._new_consumer()
        offloader = PayloadOffloader(self.settings.limits, payload_store(self.settings))
        self.worker.runner.offload = offloader

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
    def producer(self) -> DeliveryProducer:
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
        """One round: poll, start tasks, send finished results, serve their deliveries,
        produce failed ones again, pause/resume, maybe commit."""
        self._rejoin_if_left_out()
        records = self._poll()
        if records:
            self.policy.changed()  # their offsets settle, some without any record to send
        self._send(self.worker.accept(records))
        wait = _BUSY_POLL_S if self.worker.running and not records else 0.0
        self._send(self.worker.collect(wait))
        self.producer.poll(0)
        self._check_deliveries()
        self._apply_flow()
        if self.policy.due(idle=self.worker.settled and not records):
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
        sending = self.producer.outstanding > 0 or self.worker.unsent > 0
        timeout = 0.0 if busy else (_BUSY_POLL_S if sending else _IDLE_POLL_S)
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
            headers=_task_headers(message.headers(), self.worker.tracing.enabled),
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
            resume_partitions(self.consumer, self.consumer.assignment(), self._leaders)
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
            resume_partitions(
                self.consumer,
                [TopicPartition(self.source_topic, p) for p in resume],
                self._leaders,
            )
        self._crowded = crowded

    # --- producing and committing -----------------------------------------------------------

    def _send(self, records: Iterable[Outbound]) -> None:
        for record in records:
            try:
                self._produce(record)
            except RecordRejectedError as exc:
                if record.dead:
                    raise  # a dead letter the producer refuses: no retry makes it fit
                self._produce(self.worker.replace_rejected(record, str(exc)))

    def _produce(self, record: Outbound) -> None:
        def done(error: Outcome) -> None:
            self._delivery(record, error)

        if record.requeue_to is not None:  # an unserved task back onto its own queue
            self.producer.produce(
                self.source_topic,
                record.key,
                record.value,
                done,
                partition=record.requeue_to,
                headers=record.headers,
            )
            return
        topic = self.topics.dead_letters if record.dead else self.topics.activity_results
        self.producer.produce(topic, record.key, record.value, done, headers=record.headers)

    def _delivery(self, record: Outbound, error: Outcome) -> None:
        """One record's outcome (called from the producer's poll, on the loop's thread)."""
        if error is None:
            if self.worker.delivered(record):
                self.policy.changed()
            self._failing_since, self._retry_s = None, _RETRY_FIRST_S
            return
        if is_refusal(error):  # produced again it gets the same answer
            if record.dead:
                self._refused = RecordRejectedError(f"a dead letter was refused: {error}")
                return
            replaced = self.worker.replace_rejected(record, str(error))
            self.worker.undelivered(replaced)
            self._redo_at = 0.0
            return
        self.redeliveries += 1
        self.worker.undelivered(record)
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._redo_at = now + self._retry_s
        self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)
        self._log_delivery_error(error)

    def _log_delivery_error(self, error: KafkaError) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= _ERROR_LOG_EVERY_S:
            self._last_error_log = now
            log.warning(
                "worker %s: a record could not be delivered (%s); it is produced again and "
                "its task's offset stays uncommitted until it is delivered",
                self.worker_id,
                error,
            )

    def _check_deliveries(self) -> None:
        """Produce again what failed once its delay is over; stop after failing too long."""
        if self._refused is not None:
            raise self._refused
        failing = self._failing_since
        if failing is not None and time.monotonic() - failing >= _RECOVERY_S:
            raise BrokerError(
                f"records could not be delivered for {_RECOVERY_S:.0f}s; the worker stops so "
                f"that its tasks move to another worker. Check the brokers' health."
            )
        if time.monotonic() >= self._redo_at:
            self._send(self.worker.redo())

    def _commit(self, *, wait: bool = False) -> None:
        """Commit each partition up to its lowest unsettled task (asynchronously, except
        when ``wait``: before partitions go and at shutdown)."""
        offsets = self.worker.offsets.to_commit()
        self.policy.committed()
        if not offsets:
            return
        positions = [TopicPartition(self.source_topic, p, o) for p, o in offsets.items()]
        try:
            if wait:
                answer = self.consumer.commit(offsets=positions, asynchronous=False)
                failed = [tp.partition for tp in answer or [] if tp.error is not None]
                offsets = {p: o for p, o in offsets.items() if p not in failed}
            else:
                self.consumer.commit(offsets=positions)
        except KafkaException as exc:  # they are committed again later (or redelivered)
            log.warning("committing the worker's offsets failed: %s", exc)
            self.policy.changed()
            return
        self.worker.committed(offsets)
        self.commits += 1
        for p, offset in offsets.items():
            tp = TopicPartition(self.source_topic, p)
            _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                self.metrics.consumer_lag(p, high - offset, self.task_queue)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """An asynchronous commit's answer: a failed one is sent again next time."""
        if error is None:
            return
        log.warning("committing the worker's offsets failed (sent again): %s", error)
        self.worker.offsets.commit_failed(tp.partition for tp in partitions)
        self.policy.changed()

    def _settle(self, timeout_s: float) -> None:
        """Wait (bounded) until every record produced so far is delivered, producing failed
        ones again meanwhile: before a commit that has to cover everything finished."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._send(self.worker.redo())
            left = max(deadline - time.monotonic(), 0.0)
            self.producer.flush(min(left, 0.5))
            if self.worker.unsent == 0:
                return
            if left <= 0.0:
                log.warning(
                    "worker %s: %d record(s) not delivered in time; their tasks' offsets "
                    "stay uncommitted",
                    self.worker_id,
                    self.worker.unsent,
                )
                return
            if self.worker.redo_pending:
                time.sleep(min(self._retry_s, left))

    # --- rebalancing ------------------------------------------------------------------------

    def _rejoin(self, cause: BrokerError) -> None:
        """A consumer that failed for good (librdkafka's fatal errors; a static member can
        be fenced by its own rejoin after the coordinator restarted) is replaced, bounded by
        :class:`Recovery`: its partitions' unfinished tasks are dropped (their offsets were
        not committed, so whoever owns them next runs them) and a new consumer rejoins."""
        self._recovery.failed(cause)  # raises once the bounds are used up
        old, self._consumer = self.consumer, None
        self.worker.revoked(tp.partition for tp in old.assignment())
        close_within(f"closing the failed consumer of worker {self.worker_id}", old.close, 10.0)
        self._paused = False
        self._consumer = self._new_consumer()

    def _rejoin_if_left_out(self) -> None:
        """A consumer that lost its partitions (its session expired, say while the broker
        was paused) and got none back within :data:`_LEFT_OUT_S` is replaced, as a failed
        one is: librdkafka was seen to stay out of the group for good after such a loss."""
        if self._lost_at is None or time.monotonic() - self._lost_at < _LEFT_OUT_S:
            return
        self._lost_at = None
        if not self.consumer.assignment():
            self._rejoin(BrokerError("the worker's consumer lost its partitions and got none back"))

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._lost_at = None
        log.info("assigned %s", sorted(tp.partition for tp in partitions))
        self.worker.assigned(tp.partition for tp in partitions)
        self._repause = True

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Deliver what finished and commit what is settled before the partitions go; drop
        their unfinished tasks."""
        if consumer is not self._consumer:
            return  # a failed consumer being closed (``_rejoin`` dropped its partitions)
        log.info("revoked %s", sorted(tp.partition for tp in partitions))
        self._send(self.worker.collect())
        self._settle(_REVOKE_FLUSH_S)
        self._commit(wait=True)
        self.worker.revoked(tp.partition for tp in partitions)
        self.metrics.partitions_dropped((tp.partition for tp in partitions), self.task_queue)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Lost partitions can no longer take offsets: forget them. Their records still on
        the way may arrive (a copy of what the next owner produces, which the processor
        drops)."""
        if consumer is not self._consumer:
            return  # a failed consumer being closed (``_rejoin`` dropped its partitions)
        log.warning("lost %s", sorted(tp.partition for tp in partitions))
        self._lost_at = time.monotonic()
        self.worker.revoked(tp.partition for tp in partitions)

    # --- shutdown ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Stop taking tasks, let running ones finish and their results be delivered
        (bounded), commit."""
        self.consumer.pause(self.consumer.assignment())
        self._paused = True
        dropped = self.worker.drop_backlog()
        deadline = time.monotonic() + self.shutdown_timeout_s
        while self.worker.running and time.monotonic() < deadline:
            self.consumer.poll(0.0)
            self._send(self.worker.collect(0.05))
            self.producer.poll(0)
        self._send(self.worker.collect())
        self._settle(max(deadline - time.monotonic(), 1.0))
        self._commit(wait=True)
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
                    self._producer.close(5.0)
                except Exception as exc:
                    log.warning("closing the producer failed: %s", exc)
        self.worker.shutdown()


def run_loops(workers: list[KafkaWorker], stop: threading.Event) -> None:
    """Run one loop per task queue until ``stop`` is set. Each queue has its own consumer
    and producer, so a busy queue never holds up another; if one loop
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
