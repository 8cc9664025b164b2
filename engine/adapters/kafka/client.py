"""Kafka side of the workflow client: a command producer, a status-topic reader and a
command-outcome reader.

The producer is idempotent and partitions with murmur2, so a command for an instance lands
on the same partition as one written by a Java or Go producer. The reader is assigned every
partition of the compacted status topic from the beginning (no consumer group: each client
needs the whole topic) and folds it into a :class:`StatusView`; it reports "caught up" once
every partition was read up to its last stable offset as of the reader's start: what was
committed then, whatever transactions are still open (a busy partition always has one).
The outcome reader starts at the outcome topic's last stable offset as of its start
(read_committed: an outcome is visible once its turn committed) and hands every record to
the client's :class:`OutcomeWaiters`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Collection, Iterable
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from engine.adapters.kafka.config import consumer_config, producer_config
from engine.adapters.kafka.io import poll_batch, stable_end_offsets
from engine.adapters.kafka.logs import unreachable_message, watch_of
from engine.adapters.tracing import current_headers
from engine.core.errors import BrokerError, BrokerUnreachableError, WaitTimeoutError
from engine.core.keys import instance_key, murmur2_partition
from engine.services.client.outcomes import OutcomeWaiters
from engine.services.client.workflow_client import StatusView

__all__ = ["KafkaCommandSink", "KafkaOutcomeReader", "KafkaStatusReader", "partition_count"]

log = logging.getLogger(__name__)

_BUFFER_FULL_POLL_S = 0.05
_READ_BATCH = 1000


def partition_count(
    client: Producer | Consumer,
    topic: str,
    timeout_s: float = 10.0,
    *,
    missing_wait_s: float = 3.0,
    config: dict[str, Any] | None = None,
) -> int:
    """How many partitions ``topic`` has; raises a BrokerError saying what to do if none.

    A topic created a moment ago may not be in every broker's metadata yet, so a missing
    topic is asked for again for ``missing_wait_s`` before giving up. ``config`` (the
    client's) lets an unreachable broker be explained in the engine's words.
    """
    deadline = time.monotonic() + missing_wait_s
    while True:
        try:
            metadata = client.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            watch = watch_of(config or {})
            if watch is not None:
                client.poll(0)  # error callbacks run from poll: collect what went wrong
                raise BrokerUnreachableError(
                    unreachable_message(watch.bootstrap_servers, watch.last, timeout_s)
                ) from None
            raise BrokerError(
                f"cannot read metadata of topic {topic!r}: {exc}; check bootstrap servers"
            ) from exc
        info = metadata.topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            return len(info.partitions)
        if time.monotonic() >= deadline:
            namespace = topic.rsplit(".", 1)[0]
            raise BrokerError(
                f"topic {topic!r} does not exist; create the engine's topics first with "
                f"'turnstile topics apply --namespace {namespace}' (or check --namespace)"
            )
        time.sleep(0.1)


class KafkaCommandSink:
    """Produces commands to one topic; ``flush`` reports any record that failed."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        extra: dict[str, Any] | None = None,
        *,
        connect_timeout_s: float = 10.0,
    ):
        self.topic = topic
        config = producer_config(
            bootstrap_servers,
            client_id="turnstile-client",
            **{"linger.ms": 1, "allow.auto.create.topics": False, **(extra or {})},
        )
        self._producer = Producer(config)
        try:
            partition_count(self._producer, topic, connect_timeout_s, config=config)
        except BrokerError:
            self._producer.close()
            raise
        self._lock = threading.Lock()
        self._errors: list[str] = []

    def send(self, key: bytes, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value,
                    key,
                    on_delivery=self._on_delivery,
                    headers=current_headers() or None,  # the caller's trace context
                )
                break
            except BufferError:
                self._producer.poll(_BUFFER_FULL_POLL_S)
            except KafkaException as exc:
                raise BrokerError(f"cannot send a command to {self.topic!r}: {exc}") from exc
        self._producer.poll(0)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            with self._lock:
                self._errors.append(f"{message.key()!r}: {error}")

    def flush(self, timeout_s: float) -> None:
        left = self._producer.flush(timeout_s)
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise BrokerError(
                f"{len(errors)} command(s) were not written to {self.topic!r} "
                f"(first: {errors[0]}); check the broker and that the topic exists, then retry"
            )
        if left:
            raise BrokerError(
                f"{left} command(s) were not written to {self.topic!r} within {timeout_s}s; "
                f"is Kafka reachable?"
            )

    def close(self, timeout_s: float = 10.0) -> None:
        try:
            self._producer.flush(timeout_s)
        finally:
            self._producer.close()


class _Mark:
    """Offsets the status reader must read up to, per partition: the last stable offsets
    asked when the mark was taken (``ends`` None: not asked yet)."""

    def __init__(self, partitions: Collection[int], ends: dict[int, int] | None = None) -> None:
        self.partitions = sorted(partitions)
        self.ends = ends
        self.reached = threading.Event()


class KafkaStatusReader:
    """A background thread that folds the status topic into a :class:`StatusView`.

    Where the view stands is told by *marks*: per partition, an offset to read up to. The
    first is each partition's last stable offset when the reader is made, so the view is
    ready with everything committed before the client started, and no transaction still
    open is waited for (a busy partition always has one). :meth:`catch_up` takes a new mark
    for a read that must show a command's effect. A mark is reached when the consumer's
    position is at or past it: a partition that is never quiet sends no partition-EOF, and
    a position passes a transaction marker only with the next record or an EOF.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        view: StatusView,
        extra: dict[str, Any] | None = None,
        *,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.topic = topic
        self.view = view
        config = consumer_config(
            bootstrap_servers,
            f"turnstile-client-{uuid.uuid4().hex}",
            client_id="turnstile-client-status",
            **{
                # the EOF moves the position past a trailing transaction marker
                "enable.partition.eof": True,
                # short enough that a quiet partition's EOF comes promptly, long enough that
                # an idle client does not keep the broker busy
                "fetch.wait.max.ms": 100,
                "fetch.error.backoff.ms": 50,
                **(extra or {}),
            },
        )
        self._consumer = Consumer(config)
        try:
            self.partitions = partition_count(
                self._consumer, topic, connect_timeout_s, config=config
            )
            self._ready = _Mark(range(self.partitions), self._stable_ends(range(self.partitions)))
        except BrokerError:
            self._consumer.close()
            raise
        self._marks: list[_Mark] = [self._ready]
        self._asked: queue.SimpleQueue[_Mark] = queue.SimpleQueue()
        # Offset 0 rather than OFFSET_BEGINNING: the logical offset costs an offset lookup
        # that librdkafka answers ~0.5 s late; if the log starts later (records deleted),
        # auto.offset.reset=earliest resolves it anyway.
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(self.partitions)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-reader", daemon=True)
        view.attach(self)

    def start(self) -> KafkaStatusReader:
        self._thread.start()
        return self

    # --- StatusFeed ---------------------------------------------------------------------------

    def partition_of(self, instance_id: str) -> int:
        return murmur2_partition(instance_key(instance_id), self.partitions)

    def catch_up(self, partitions: Collection[int], timeout_s: float) -> None:
        """Block until the view holds what is committed on ``partitions`` now (the reader
        thread asks their last stable offsets, then reads up to them)."""
        mark = _Mark(partitions)
        self._asked.put(mark)
        if not self._thread.is_alive():
            return  # stopped: the view says why (a reader that ends releases every mark)
        if not mark.reached.wait(timeout_s):
            raise WaitTimeoutError(
                f"the status view did not catch up with partitions {mark.partitions} of "
                f"{self.topic} within {timeout_s:.0f}s; check that Kafka is reachable, or "
                f"pass a longer timeout"
            )

    # --- the reader thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for message in poll_batch(self._consumer, _READ_BATCH, 0.1):
                    self._handle(message)
                self._settle()
        except Exception as exc:  # the view must learn that it will not be fed any more
            log.exception("status reader stopped")
            self.view.mark_failed(BrokerError(f"the status reader stopped: {exc}"))
        finally:
            self._consumer.close()
            for mark in self._pending():  # nobody waits for a reader that is gone
                mark.reached.set()

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is None:
            self.view.apply_record(message.key(), message.value())
        elif error.fatal():
            raise KafkaException(error)
        elif error.code() != KafkaError._PARTITION_EOF:
            log.warning("status reader: %s", error)

    def _pending(self) -> list[_Mark]:
        while not self._asked.empty():
            self._marks.append(self._asked.get_nowait())
        return self._marks

    def _settle(self) -> None:
        """Take the marks asked for, and release those the positions reached."""
        marks = self._pending()
        if not marks:
            return
        for mark in marks:
            if mark.ends is None:
                mark.ends = self._stable_ends(mark.partitions)
        wanted = sorted({p for mark in marks for p in mark.partitions})
        read = self._consumer.position([TopicPartition(self.topic, p) for p in wanted])
        at = {tp.partition: tp.offset for tp in read}
        for mark in marks:
            assert mark.ends is not None
            if all(at[p] >= end for p, end in mark.ends.items()):
                mark.reached.set()
                if mark is self._ready:
                    self.view.mark_ready()
        self._marks = [mark for mark in marks if not mark.reached.is_set()]

    def _stable_ends(self, partitions: Iterable[int]) -> dict[int, int]:
        """Per partition, the offset to read up to: its last stable offset, unless nothing
        below it is left to read (an empty partition, or one whose records were deleted)."""
        wanted = [TopicPartition(self.topic, p) for p in partitions]
        bounds = stable_end_offsets(self._consumer, wanted)
        return {p: end for (_, p), (low, end) in bounds.items() if end > low}

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        elif not self._thread.ident:
            self._consumer.close()


class KafkaOutcomeReader:
    """A background thread that hands the command-outcomes topic to :class:`OutcomeWaiters`.

    It is assigned every partition at its last stable offset as of its creation (no consumer
    group): every answer committed after that is read, those of transactions open then
    included, so every command sent after it exists finds its answer; it waits for no open
    transaction to start, and reads no history of outcomes the client never asked for.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        waiters: OutcomeWaiters,
        extra: dict[str, Any] | None = None,
        *,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.topic = topic
        self.waiters = waiters
        config = consumer_config(
            bootstrap_servers,
            f"turnstile-client-{uuid.uuid4().hex}",
            client_id="turnstile-client-outcomes",
            **{"fetch.error.backoff.ms": 50, **(extra or {})},
        )
        self._consumer = Consumer(config)
        try:
            partitions = partition_count(self._consumer, topic, connect_timeout_s, config=config)
            wanted = [TopicPartition(topic, p) for p in range(partitions)]
            ends = stable_end_offsets(self._consumer, wanted)
        except BrokerError:
            self._consumer.close()
            raise
        self._consumer.assign(
            [TopicPartition(topic, p, ends[(topic, p)][1]) for p in range(partitions)]
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outcome-reader", daemon=True)

    def start(self) -> KafkaOutcomeReader:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for message in poll_batch(self._consumer, _READ_BATCH, 0.1):
                    self._handle(message)
        except Exception as exc:  # the waiters must learn that no answer will come
            log.exception("command outcome reader stopped")
            self.waiters.mark_failed(BrokerError(f"the command outcome reader stopped: {exc}"))
        finally:
            self._consumer.close()

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is None:
            self.waiters.apply_record(message.value())
        elif error.fatal():
            raise KafkaException(error)
        elif error.code() != KafkaError._PARTITION_EOF:
            log.warning("command outcome reader: %s", error)

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        elif not self._thread.ident:
            self._consumer.close()
