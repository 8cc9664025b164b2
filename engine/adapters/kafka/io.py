"""Kafka I/O helpers shared by the processor and the activity worker.

:class:`TransactionalProducer` wraps a confluent-kafka producer with the error handling that
librdkafka's transactional API asks of its callers, so that every caller reacts the same way:

- a *retriable* error (the coordinator was busy, a request timed out inside librdkafka) is
  retried until the operation's time budget runs out;
- an error that *requires abort* (a record failed for good, the coordinator lost the
  transaction) aborts the transaction and raises :class:`AbortedTransaction`: the caller
  drops what it prepared for this transaction and seeks its consumer back;
- a *fatal* error, and a commit or abort that *times out*, recreate the producer with the
  same ``transactional.id`` (its ``init_transactions`` fences the old instance and aborts
  whatever it left open - librdkafka has no KIP-890 to make a timed-out commit safe to
  retry) and raise :class:`AbortedTransaction`;
- being *fenced* raises :class:`ProducerFencedError`: another process took this
  ``transactional.id``, or this one stalled past the transaction timeout; the caller drops
  its uncommitted work and makes a new producer, a bounded number of times
  (:mod:`engine.adapters.kafka.recovery`), rather than fencing back in a loop;
- a blocking call (``init_transactions``, ``send_offsets_to_transaction``,
  ``commit_transaction``, ``abort_transaction``) that does not return by its deadline is
  abandoned with its producer (:mod:`engine.adapters.kafka.deadline`): the producer is
  recreated and :class:`AbortedTransaction` raised, or the process ends itself when even that
  is stuck.

The consumer helpers build a consumer, read its positions for
``send_offsets_to_transaction`` and wait, bounded, for a group assignment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple, NoReturn, TypeVar

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from engine.adapters.kafka.deadline import (
    CallDeadlineExceeded,
    DeadlineCaller,
    close_within,
    end_process_stuck,
)
from engine.core.errors import BrokerError

__all__ = [
    "AbortedTransaction",
    "Delivered",
    "LeaderCache",
    "ProducerFencedError",
    "RecordRejectedError",
    "TransactionalProducer",
    "is_fatal",
    "kafka_error",
    "leave_group",
    "log_end_offsets",
    "make_consumer",
    "message_headers",
    "poll_batch",
    "positions_for",
    "produce_with_room",
    "resume_partitions",
    "stable_end_offsets",
    "wait_for_assignment",
]

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]
RebalanceCallback = Callable[[Consumer, list[TopicPartition]], None]
T = TypeVar("T")

_BUFFER_FULL_POLL_S = 0.05
_RETRY_PAUSE_S = 0.01


class AbortedTransaction(BrokerError):
    """The current transaction was aborted; nothing of it is visible to read_committed readers.

    Drop every change prepared for it and seek the input back to the last committed offsets:
    the records will be consumed and processed again.
    """


class ProducerFencedError(BrokerError):
    """Another producer with the same ``transactional.id`` took over: this one must stop."""


class RecordRejectedError(BrokerError):
    """The producer refused one record up front (too large, unknown partition...).

    The transaction stays open and usable; the caller decides whether to abort it or to
    produce something else instead (for example a failure in place of a too-large result).
    """


class Delivered(NamedTuple):
    """Where one record of the transaction was written (one per record: a named tuple is
    the cheapest immutable record to build)."""

    topic: str
    partition: int
    offset: int


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` carried by a ``KafkaException`` (None for anything else)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_fatal(error: KafkaError | None) -> bool:
    """Whether the producer is dead: librdkafka reports that both as ``fatal()`` and as
    code ``_FATAL`` (with ``fatal()`` False)."""
    return error is not None and (bool(error.fatal()) or error.code() == KafkaError._FATAL)


def produce_with_room(
    producer: Producer, topic: str, kwargs: dict[str, Any], wait_s: float
) -> bool:
    """Queue one record, serving delivery reports while librdkafka's local queue is full;
    False when it stays full for ``wait_s``. A ``KafkaException`` (the record refused, the
    producer dead) is left to the caller, whose answer differs inside a transaction."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            producer.produce(topic, **kwargs)
            return True
        except BufferError:
            if time.monotonic() >= deadline:
                return False
            producer.poll(_BUFFER_FULL_POLL_S)


class TransactionalProducer:
    """One transactional producer, with librdkafka's transactional error handling built in.

    Use it as ``begin()``, any number of ``produce()``, optionally ``send_offsets()``, then
    ``commit()`` (or ``abort()``). ``commit()`` returns where each record was written,
    because the processor records the changelog offsets it wrote.
    """

    def __init__(
        self,
        config: dict[str, Any],
        transactional_id: str,
        timeout_s: float = 10.0,
        *,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
        deadline_grace_s: float = 5.0,
        on_stuck: Callable[[str], NoReturn] = end_process_stuck,
    ) -> None:
        self._config = {**config, "transactional.id": transactional_id}
        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self._factory = producer_factory
        self._calls = DeadlineCaller(transactional_id, grace_s=deadline_grace_s, on_stuck=on_stuck)
        self._producer = self._new_producer()
        self._open = False
        self._delivered: list[Delivered] = []
        self._failed: list[str] = []
        #: Records of the current transaction the broker refused: (topic, key, error).
        self.refused: list[tuple[str, bytes | None, KafkaError]] = []
        self.last_delivered: list[Delivered] = []
        self.recreated = 0
        self._stuck = False

    # --- lifecycle --------------------------------------------------------------------------

    def _new_producer(self) -> Producer:
        producer = self._factory(self._config)
        try:
            self._calls.call(
                "init_transactions",
                self.timeout_s,
                lambda: producer.init_transactions(self.timeout_s),
            )
        except CallDeadlineExceeded as exc:
            # A fresh producer that cannot even initialise: nothing left to recreate.
            self._calls.on_stuck(f"a new producer could not initialise transactions: {exc}")
        except KafkaException as exc:
            # closed, or it would go on trying and fence its successor once the broker is back
            close_within(f"closing producer {self.transactional_id}", producer.close, 1.0)
            raise BrokerError(
                f"could not initialise transactions for transactional.id "
                f"{self.transactional_id!r}: {exc}. Check that the brokers are reachable and "
                f"that the transaction coordinator is available (transaction.state.log "
                f"replication settings on small clusters)."
            ) from exc
        return producer

    def _recreate(self, reason: str, *, stuck: bool = False) -> None:
        """Replace the producer; the new one's init_transactions fences the old one.

        A ``stuck`` producer (a call on it passed its deadline) is left alone: another thread
        is still inside it.
        """
        log.warning("recreating transactional producer %s: %s", self.transactional_id, reason)
        self._open = False
        old = self._producer
        self._stuck = stuck  # until a new producer replaced it, close() must not touch it
        if not stuck:
            try:
                old.purge(True, True, False)
            except (KafkaException, RuntimeError) as exc:
                log.debug("purging the old producer failed (ignored): %s", exc)
            # close() flushes without a timeout: never let it hold up the new producer
            close_within(f"closing the old producer {self.transactional_id}", old.close, 1.0)
        self._producer = self._new_producer()
        self._stuck = False
        self.recreated += 1

    def close(self) -> None:
        """Abort an open transaction and close the producer."""
        if self._open:
            try:
                self.abort()
            except BrokerError as exc:
                log.warning("abort on close failed: %s", exc)
        if self._stuck:  # a call is still inside it, and destroying it then is not safe
            log.warning("leaving producer %s behind: a call on it is stuck", self.transactional_id)
        else:
            close_within(
                f"closing producer {self.transactional_id}", self._producer.close, self.timeout_s
            )
        self._calls.close()

    @property
    def in_transaction(self) -> bool:
        """Whether ``begin()`` was called and neither commit nor abort has ended it yet."""
        return self._open

    @property
    def producer(self) -> Producer:
        """The underlying producer (it changes when the producer is recreated)."""
        return self._producer

    # --- transaction ------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a transaction (records and offsets until commit or abort belong to it)."""
        if self._open:
            raise BrokerError("a transaction is already open; commit() or abort() it first")
        self._delivered = []
        self._failed = []
        self.refused = []
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            error = kafka_error(exc)
            self._raise_if_fenced(error)
            if error is None or not error.fatal():
                raise BrokerError(f"cannot begin a transaction: {exc}") from exc
            self._recreate(f"begin_transaction failed: {exc}")
            self._producer.begin_transaction()
        self._open = True

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: Headers | None = None,
        *,
        track: bool = True,
    ) -> None:
        """Queue one record in the open transaction; waits while the local queue is full.

        A tracked record's offset is in :attr:`delivered` (and what :meth:`commit`
        returns); an untracked one is only watched for its refusal (:attr:`refused`), which
        spares the offset's bookkeeping on records whose offsets nobody reads."""
        if not self._open:
            self._require_open("produce")
        report = self._on_delivery if track else self._on_refusal
        try:
            # positional: topic, value, key, partition (-1: by key), callback - no keyword
            # dict to build on the path every record takes (most records have no headers)
            where = -1 if partition is None else partition
            if headers:
                self._producer.produce(topic, value, key, where, report, headers=list(headers))
            else:
                self._producer.produce(topic, value, key, where, report)
            return
        except BufferError:
            pass  # the local queue is full: wait for room below
        except KafkaException as exc:
            self._on_produce_error(exc, topic)
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": report}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers)
        try:
            queued = produce_with_room(self._producer, topic, kwargs, self.timeout_s)
        except KafkaException as exc:
            self._on_produce_error(exc, topic)
        if not queued:
            self._abort_and_raise("the producer queue stayed full")

    def _on_produce_error(self, exc: KafkaException, topic: str) -> NoReturn:
        error = kafka_error(exc)
        self._raise_if_fenced(error)
        if is_fatal(error):
            self._recreate(f"produce failed: {exc}")
            raise AbortedTransaction(f"producer failed fatally, transaction aborted: {exc}")
        if error is not None and error.txn_requires_abort():
            self._abort_and_raise(f"produce failed: {exc}")
        raise RecordRejectedError(f"record for topic {topic!r} was refused: {exc}") from exc

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            self._delivered.append(Delivered(str(topic), partition or 0, offset or 0))
        else:
            self._on_refusal(error, message)

    def _on_refusal(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._failed.append(f"{message.topic()}: {error}")
            self.refused.append((str(message.topic()), message.key(), error))

    def send_offsets(self, offsets: Iterable[TopicPartition], group_metadata: Any) -> None:
        """Commit these consumer offsets with the transaction (next offsets to read)."""
        self._require_open("send_offsets")
        valid = [tp for tp in offsets if tp.offset >= 0]
        if not valid:
            return
        self._call_in_txn(
            "send_offsets_to_transaction",
            lambda budget: self._producer.send_offsets_to_transaction(
                valid, group_metadata, budget
            ),
        )

    def commit(self) -> list[Delivered]:
        """Commit the transaction; returns where its records were written.

        Raises :class:`AbortedTransaction` when the transaction could not be committed (it
        is then aborted, or the producer recreated): drop pending changes and seek back.
        """
        self._require_open("commit")
        self._call_in_txn("commit_transaction", self._producer.commit_transaction)
        self._open = False
        self._producer.poll(0)
        self.last_delivered = self._delivered
        self._delivered = []
        return self.last_delivered

    def abort(self) -> None:
        """Abort the open transaction (recreating the producer if the abort cannot finish)."""
        self._require_open("abort")
        deadline = time.monotonic() + self.timeout_s
        while True:
            budget = max(deadline - time.monotonic(), 0.001)
            try:
                self._calls.call(
                    "abort_transaction", budget, partial(self._producer.abort_transaction, budget)
                )
                break
            except CallDeadlineExceeded as exc:
                self._recreate(str(exc), stuck=True)
                break
            except KafkaException as exc:
                error = kafka_error(exc)
                self._raise_if_fenced(error)
                if self._must_recreate(error) or time.monotonic() >= deadline:
                    self._recreate(f"abort_transaction failed: {exc}")
                    break
                time.sleep(_RETRY_PAUSE_S)
        self._open = False
        self._delivered = []
        self._producer.poll(0)

    @property
    def delivered(self) -> list[Delivered]:
        """Where the records of the open transaction were written, so far as reported."""
        return self._delivered

    def flush_delivered(self) -> None:
        """Wait until every record of the open transaction is written (still uncommitted),
        so that :attr:`delivered` has their offsets: a record that refers to earlier ones
        by offset (a large payload's reference) is produced after this."""
        self._require_open("flush_delivered")
        left = self._producer.flush(self.timeout_s)
        if left or self._failed:
            self._abort_and_raise(
                f"records of the transaction were not written ({self._failed[:1] or left})"
            )

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery callbacks (call it now and then while a transaction is open)."""
        return int(self._producer.poll(timeout_s))

    # --- error handling ---------------------------------------------------------------------

    def _call_in_txn(self, what: str, call: Callable[[float], T]) -> T:
        """Run a transactional call, retrying retriable errors within the time budget."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            budget = max(deadline - time.monotonic(), 0.001)
            try:
                return self._calls.call(what, budget, partial(call, budget))
            except CallDeadlineExceeded as exc:
                self._recreate(str(exc), stuck=True)
                raise AbortedTransaction(
                    f"{exc}; the producer was recreated, which aborts the transaction"
                ) from exc
            except KafkaException as exc:
                error = kafka_error(exc)
                self._raise_if_fenced(error)
                if self._must_recreate(error):
                    self._recreate(f"{what} failed: {exc}")
                    raise AbortedTransaction(
                        f"{what} failed ({exc}); the producer was recreated, which aborted "
                        f"the transaction"
                    ) from exc
                if error is not None and error.txn_requires_abort():
                    self._abort_and_raise(f"{what} failed: {exc}")
                if error is not None and error.retriable() and time.monotonic() < deadline:
                    time.sleep(_RETRY_PAUSE_S)
                    continue
                self._recreate(f"{what} failed and cannot be retried: {exc}")
                raise AbortedTransaction(f"{what} failed: {exc}; transaction aborted") from exc

    @staticmethod
    def _must_recreate(error: KafkaError | None) -> bool:
        """Fatal errors and timeouts of commit/abort: the producer's state is unknown."""
        if error is None:
            return True
        return bool(error.fatal()) or error.code() in (KafkaError._TIMED_OUT, KafkaError._FATAL)

    def _raise_if_fenced(self, error: KafkaError | None) -> None:
        if error is not None and error.code() == KafkaError._FENCED:
            self._open = False
            raise ProducerFencedError(
                f"transactional.id {self.transactional_id!r} was fenced: either another "
                f"process now uses it, or this process stalled for longer than the transaction "
                f"timeout and the broker aborted its transaction. Its work since the last "
                f"commit is dropped and done again with a new producer (a bounded number of "
                f"times); give every running process its own id (worker id / replica id)."
            )

    def _abort_and_raise(self, reason: str) -> NoReturn:
        failed = f" (failed records: {'; '.join(self._failed[:3])})" if self._failed else ""
        self.abort()
        raise AbortedTransaction(f"transaction aborted: {reason}{failed}")

    def _require_open(self, what: str) -> None:
        if not self._open:
            raise BrokerError(f"{what}() needs an open transaction; call begin() first")


# --- consumers ----------------------------------------------------------------------------


def make_consumer(
    config: dict[str, Any],
    topics: Sequence[str] | None = None,
    *,
    assignment: Sequence[TopicPartition] | None = None,
    on_assign: RebalanceCallback | None = None,
    on_revoke: RebalanceCallback | None = None,
    on_lost: RebalanceCallback | None = None,
) -> Consumer:
    """A consumer that either subscribes to ``topics`` (group-managed) or is assigned fixed
    partitions (``assignment``); the callbacks only apply to subscriptions."""
    if (topics is None) == (assignment is None):
        raise ValueError("pass exactly one of topics (subscribe) or assignment (assign)")
    consumer = Consumer(config)
    if assignment is not None:
        consumer.assign(list(assignment))
        return consumer
    kwargs: dict[str, RebalanceCallback] = {}
    if on_assign is not None:
        kwargs["on_assign"] = on_assign
    if on_revoke is not None:
        kwargs["on_revoke"] = on_revoke
    if on_lost is not None:
        kwargs["on_lost"] = on_lost
    consumer.subscribe(list(topics or ()), **kwargs)
    return consumer


def leave_group(consumer: Consumer, timeout_s: float = 5.0) -> bool:
    """Leave the consumer group now, so the partitions move to the other members at once.

    A static member (``group.instance.id``) does not leave its group when it closes: the
    coordinator keeps its partitions for it until its session times out, which is what lets a
    crashed process restart into its old assignment. librdkafka skips the LeaveGroup request
    only when the consumer *terminates*; ``unsubscribe()`` revokes the assignment (the revoke
    callback runs in the polls below) and then sends it, for static members too. Records
    polled meanwhile are dropped: they were never handled, so their offsets are not
    committed and the next owner reads them. Returns whether the assignment was released in
    time (a broker that does not answer leaves the group to the session timeout).
    """
    try:
        consumer.unsubscribe()
    except KafkaException as exc:
        log.warning("leaving the consumer group failed: %s", exc)
        return False
    deadline = time.monotonic() + timeout_s
    while consumer.assignment():
        if time.monotonic() >= deadline:
            log.warning("the consumer group did not take the partitions back in %.0fs", timeout_s)
            return False
        consumer.poll(0.05)
    consumer.poll(0.05)  # let the LeaveGroup request go out before close()
    return True


def poll_batch(consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
    """Up to ``max_records`` messages, returning as soon as *one* is there.

    ``Consumer.consume(n, timeout)`` waits until it has ``n`` messages or the timeout passed,
    which adds the whole timeout to the latency of a lone record; this waits only for the
    first message, then takes whatever else is already fetched without waiting.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(max_records - 1, 0)]


def resume_partitions(
    consumer: Consumer,
    partitions: Sequence[TopicPartition],
    leaders: LeaderCache | None = None,
) -> None:
    """Resume paused partitions *and* get fetching going again at once.

    When every partition a broker leads is paused, librdkafka's thread for that broker has
    nothing to fetch and sleeps for up to a second; ``resume`` does not wake it, so the
    first record after a resume would come ~1 s late. Any request to that broker wakes the
    thread, so ask each leader for one partition's watermarks. ``leaders`` remembers who
    leads what, so that a loop resuming often does not ask for metadata every time.
    """
    if not partitions:
        return
    consumer.resume(list(partitions))
    cache = leaders or LeaderCache()
    for tp in cache.one_partition_per_leader(consumer, partitions):
        try:
            consumer.get_watermark_offsets(tp, timeout=1.0, cached=False)
        except KafkaException as exc:  # only a nudge: fetching resumes within 1 s anyway
            log.debug("watermark nudge after resume failed: %s", exc)


class LeaderCache:
    """Which broker leads each partition, per topic, looked up at most every ``ttl_s``.

    A stale entry only sends a resume's wake-up request to the wrong broker (fetching then
    resumes within a second on its own), so a short staleness is harmless.
    """

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._topics: dict[str, tuple[float, dict[int, int]]] = {}

    def leaders(self, consumer: Consumer, topic: str) -> dict[int, int]:
        """Partition -> leader id of ``topic`` (empty when the metadata cannot be read)."""
        now = time.monotonic()
        known = self._topics.get(topic)
        if known is not None and now - known[0] < self.ttl_s:
            return known[1]
        try:
            metadata = consumer.list_topics(topic, timeout=1.0).topics.get(topic)
        except KafkaException:
            return {}
        found = {p: info.leader for p, info in (metadata.partitions if metadata else {}).items()}
        self._topics[topic] = (now, found)
        return found

    def one_partition_per_leader(
        self, consumer: Consumer, partitions: Sequence[TopicPartition]
    ) -> list[TopicPartition]:
        chosen: dict[int, TopicPartition] = {}
        for tp in partitions:
            leader = self.leaders(consumer, tp.topic).get(tp.partition, -1)
            chosen.setdefault(leader, TopicPartition(tp.topic, tp.partition))
        return list(chosen.values())


def positions_for(consumer: Consumer, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    """The consumer's next offsets for ``partitions``, leaving out those it has none for.

    This is what ``send_offsets_to_transaction`` wants after a batch has been processed.
    """
    wanted = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    if not wanted:
        return []
    return [
        tp for tp in consumer.position(wanted) if tp.offset != OFFSET_INVALID and tp.offset >= 0
    ]


def log_end_offsets(
    config: dict[str, Any],
    partitions: Sequence[TopicPartition],
    *,
    timeout_s: float = 10.0,
    attempts: int = 5,
) -> dict[tuple[str, int], tuple[int, int]]:
    """``(low watermark, log end offset)`` of each partition, open transactions included.

    A read_committed consumer's watermark query answers with the *last stable offset* as its
    high mark, which stops at the first transaction still open; records committed after it
    are then invisible. A reader that must see every committed record compares its position
    with the end returned here (asked as read_uncommitted) instead. Retried, because a busy
    or just-elected leader may not answer at once.
    """
    probe = Consumer({**config, "isolation.level": "read_uncommitted"})
    try:
        return {
            (tp.topic, tp.partition): _watermarks(probe, tp, timeout_s, attempts)
            for tp in partitions
        }
    finally:
        probe.close()


def stable_end_offsets(
    consumer: Consumer,
    partitions: Sequence[TopicPartition],
    *,
    timeout_s: float = 10.0,
    attempts: int = 5,
) -> dict[tuple[str, int], tuple[int, int]]:
    """``(low watermark, last stable offset)`` of each partition: what is committed now.

    librdkafka asks the broker with the consumer's isolation level, so a read_committed
    ``consumer`` (every engine consumer) gets the *last stable offset* as its high mark.
    Every offset below it holds a committed or aborted record or a transaction marker, so a
    read_committed reader reaches it without waiting for any transaction: the end of a read
    that answers now, however busy the partition (``log_end_offsets`` is the end of a read
    that must see every committed record, and waits for open transactions to end).
    """
    return {
        (tp.topic, tp.partition): _watermarks(consumer, tp, timeout_s, attempts)
        for tp in partitions
    }


def _watermarks(
    consumer: Consumer, tp: TopicPartition, timeout_s: float, attempts: int
) -> tuple[int, int]:
    for attempt in range(attempts):
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if attempt == attempts - 1:
                raise BrokerError(
                    f"cannot read the offsets of {tp.topic}[{tp.partition}]: {exc}; check that "
                    f"the broker is reachable and the topics exist (topics apply)"
                ) from exc
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def wait_for_assignment(
    consumer: Consumer, timeout_s: float, *, poll_s: float = 0.05
) -> tuple[list[TopicPartition], list[Message]]:
    """Poll until the group gives ``consumer`` partitions, at most ``timeout_s`` seconds.

    Returns the assignment and any records polled meanwhile (they must be processed, not
    dropped). Raises :class:`BrokerError` when nothing is assigned in time.
    """
    deadline = time.monotonic() + timeout_s
    records: list[Message] = []
    while True:
        assignment = list(consumer.assignment())
        if assignment:
            return assignment, records
        if time.monotonic() >= deadline:
            raise BrokerError(
                f"no partitions were assigned within {timeout_s:.0f}s; check that the topics "
                f"exist and that the group has fewer members than partitions"
            )
        message = consumer.poll(poll_s)
        if message is not None and message.error() is None:
            records.append(message)


def message_headers(message: Message) -> tuple[tuple[str, bytes], ...]:
    """A consumed record's headers as (name, bytes) pairs (librdkafka may give a dict or
    str values)."""
    raw: Any = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple(
        (str(name), value.encode() if isinstance(value, str) else bytes(value or b""))
        for name, value in pairs
    )
