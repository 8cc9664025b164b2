"""The trigger bridge: business topics in, engine commands out, exactly once per record.

One consumer in the ``<namespace>.triggers`` group reads every trigger topic
(read_committed), and one transactional producer
(``<namespace>.processor.<replica id>.triggers``) writes, per batch of records, each
record's command (or dead letter, ``engine/services/triggers.py``) and the records' next
offsets in one transaction: a record acts once, whatever crashes. The commands land on
the instance's partition of the commands topic, where the owning processor replica
applies them like any client's, so the business topic's own partitioning never matters.

A batch that cannot be committed is simply abandoned: the consumer and the producer are
made again (the new producer's ``init_transactions`` fences the old one and aborts what it
left open) and reading resumes from the committed offsets, with a growing pause. That is
all a broker outage needs; a batch that fails because of one of its records (the producer
or the broker refuses its command, or mapping it raises) would fail that way for ever, so
the bridge finds the record (``services.triggers.Quarantine``: one record per transaction
after a refusal) and, after a few failures in a row, writes its dead letter instead.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from engine.adapters.kafka.config import (
    consumer_config,
    group_membership,
    transactional_producer_config,
)
from engine.adapters.kafka.deadline import close_within
from engine.adapters.kafka.io import (
    AbortedTransaction,
    RecordRejectedError,
    TransactionalProducer,
    kafka_error,
    leave_group,
    make_consumer,
    poll_batch,
)
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError
from engine.services.records import RawRecord
from engine.services.triggers import Outgoing, Place, Quarantine, given_up, place_of, route

log = logging.getLogger("engine.triggers")

#: Records per transaction, and the longest a poll blocks (a stop is seen between polls).
MAX_BATCH = 500
POLL_S = 0.5
#: Pauses between attempts after a failed batch: doubling, at most this long.
RETRY_MAX_S = 10.0
#: Refusals about one record (its size or form), not about the broker, the producer or a
#: whole topic: a topic-wide refusal (authorization, a missing topic) would refuse every
#: record, so it is retried like an outage instead of sending the stream to dead letters.
RECORD_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
    }
)


class RecordRefused(Exception):
    """The batch failed because of the record at ``place`` (``reason`` says how)."""

    def __init__(self, place: Place, reason: str) -> None:
        super().__init__(reason)
        self.place = place
        self.reason = reason


class BatchRefused(Exception):
    """A record of the batch was refused, but the refusal does not say which."""


def is_record_refusal(error: KafkaError | None) -> bool:
    return error is not None and error.code() in RECORD_REFUSALS


def trigger_group(namespace: str) -> str:
    """The consumer group of every replica's trigger bridge."""
    return f"{namespace}.triggers"


class TriggerBridge:
    """Reads the triggers' topics and writes their commands, in one transaction a batch."""

    def __init__(self, settings: Settings) -> None:
        if not settings.triggers:
            raise ValueError("a trigger bridge needs at least one trigger")
        self.settings = settings
        self._triggers = {t.topic: t for t in settings.triggers}
        self._names = topic_names(settings.namespace)
        # under the processor's transactional-id prefix, so its ACLs cover the bridge too
        self._id = f"{settings.namespace}.processor.{settings.replica_id}.triggers"
        self._consumer: Consumer | None = None
        self._producer: TransactionalProducer | None = None
        #: Records turned into commands and dead letters, and committed transactions.
        self.mapped = 0
        self.dead_letters = 0
        self.transactions = 0
        #: Batches that failed because of one of their records.
        self.refusals = 0
        self.quarantine = Quarantine()

    def run(self, stop: threading.Event) -> None:
        """Bridge until ``stop`` is set; a failed batch is redone on new clients."""
        pause = 0.5
        log.info("triggers: %s", "; ".join(t.describe() for t in self._triggers.values()))
        try:
            while not stop.is_set():
                try:
                    self._connect()
                    self.step()
                    pause = 0.5
                except (RecordRefused, BatchRefused, BrokerError, KafkaException) as exc:
                    self._failed(exc)
                    self._disconnect(leave=False)
                    stop.wait(pause)
                    pause = min(pause * 2, RETRY_MAX_S)
        finally:
            self._disconnect(leave=True)

    def _failed(self, exc: Exception) -> None:
        """Note why the batch failed: about one record, some record, or not about records."""
        if isinstance(exc, RecordRefused):
            self.refusals += 1
            strikes = self.quarantine.record_refused(exc.place, exc.reason)
            topic, partition, offset = exc.place
            log.warning(
                "trigger record %s[%d]@%d failed its batch (%d of %d before it goes to dead "
                "letters): %s",
                topic,
                partition,
                offset,
                strikes,
                self.quarantine.limit,
                exc.reason,
            )
        elif isinstance(exc, BatchRefused):
            self.refusals += 1
            self.quarantine.batch_refused()
            log.warning("a trigger batch was refused (%s); finding its record", exc)
        else:
            log.warning("trigger batch abandoned, redone from the committed offsets: %s", exc)

    def step(self) -> int:
        """One batch: poll, produce each record's command, commit it with the offsets
        (while isolating, only the first record: the rest is read again)."""
        consumer, producer = self._consumer, self._producer
        assert consumer is not None and producer is not None, "run() connects first"
        polled = [
            r for r in (self._record(m) for m in poll_batch(consumer, MAX_BATCH, POLL_S)) if r
        ]
        if not polled:
            return 0
        records = polled[:1] if self.quarantine.isolating else polled
        producer.begin()
        nexts: dict[tuple[str, int], int] = {}
        for record in records:
            out = self._outgoing(record)
            self._produce(producer, record, out)
            dead = out.topic == self._names.dead_letters
            self.dead_letters += dead
            self.mapped += not dead
            nexts[(record.topic, record.partition)] = record.offset + 1
        offsets = [TopicPartition(t, p, o) for (t, p), o in nexts.items()]
        try:
            producer.send_offsets(offsets, consumer.consumer_group_metadata())
            producer.commit()
        except AbortedTransaction as exc:
            raise _refusal_in(producer, records, exc) from exc
        self.transactions += 1
        self.quarantine.committed([place_of(r) for r in records])
        _rewind(consumer, polled[len(records) :])
        return len(records)

    def _outgoing(self, record: RawRecord) -> Outgoing:
        """The record's command or dead letter (the dead letter once the bridge gave up)."""
        trigger = self._triggers[record.topic]
        names, limit = self._names, self.settings.max_record_bytes
        verdict = self.quarantine.verdict(place_of(record))
        if verdict is not None:
            where = f"{record.topic}[{record.partition}]@{record.offset}"
            log.error("trigger record %s goes to dead letters: %s", where, verdict)
            return given_up(trigger, record, names.dead_letters, verdict, limit)
        try:
            return route(trigger, record, names.commands, names.dead_letters, limit)
        except Exception as exc:  # a bug or a value nothing foresaw: this record's alone
            raise RecordRefused(place_of(record), f"mapping it raised {exc!r}") from exc

    @staticmethod
    def _produce(producer: TransactionalProducer, record: RawRecord, out: Outgoing) -> None:
        try:
            producer.produce(out.topic, out.key, out.value, None, out.headers)
        except RecordRejectedError as exc:
            cause = kafka_error(exc.__cause__) if exc.__cause__ is not None else None
            if not is_record_refusal(cause):
                raise
            raise RecordRefused(place_of(record), f"the producer refused it: {exc}") from exc

    def _record(self, message: Message) -> RawRecord | None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("trigger consumer: %s", error)
            return None
        timestamp = message.timestamp()[1]
        return RawRecord(
            message.partition() or 0,
            message.offset() or 0,
            message.key(),
            message.value(),
            max(timestamp, 0),
            str(message.topic()),
            _headers(message),
        )

    # --- clients ----------------------------------------------------------------------------

    def _consumer_config(self) -> dict[str, Any]:
        s = self.settings
        return consumer_config(
            s.bootstrap_servers,
            trigger_group(s.namespace),
            client_id=self._id,
            **{
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
                **group_membership(self._id, static=s.static_membership),
                **s.extra_kafka,
            },
        )

    def _connect(self) -> None:
        if self._producer is None:
            config = transactional_producer_config(
                self.settings.bootstrap_servers,
                self._id,
                client_id=self._id,
                transaction_timeout_ms=10_000,
                **{"linger.ms": 1, **self.settings.extra_kafka},
            )
            self._producer = TransactionalProducer(config, self._id)
        if self._consumer is None:
            self._consumer = make_consumer(self._consumer_config(), sorted(self._triggers))

    def _disconnect(self, *, leave: bool) -> None:
        """Close both clients; an open transaction is aborted, nothing is committed."""
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if consumer is not None:
            if leave:
                leave_group(consumer)
            close_within("closing the trigger consumer", consumer.close, 30.0)
        if producer is not None:
            try:
                producer.close()
            except (BrokerError, KafkaException) as exc:
                log.warning("closing the trigger producer failed: %s", exc)


def _refusal_in(
    producer: TransactionalProducer, records: list[RawRecord], exc: AbortedTransaction
) -> Exception:
    """What an aborted commit says about the batch's records: the refused record when the
    transaction held only it, some record when it held more, else the error itself."""
    refused = [error for _, _, error in producer.refused if is_record_refusal(error)]
    if not refused:
        return exc
    reason = f"the broker refused its command: {refused[0].str()}"
    if len(records) == 1:
        return RecordRefused(place_of(records[0]), reason)
    return BatchRefused(reason)


def _rewind(consumer: Consumer, unhandled: list[RawRecord]) -> None:
    """Read these polled records again: seek each partition back to its first one."""
    firsts: dict[tuple[str, int], int] = {}
    for record in unhandled:
        firsts.setdefault((record.topic, record.partition), record.offset)
    for (topic, partition), offset in firsts.items():
        consumer.seek(TopicPartition(topic, partition, offset))


def _headers(message: Message) -> tuple[tuple[str, bytes], ...]:
    out: list[tuple[str, bytes]] = []
    raw = message.headers() or []
    for name, value in raw.items() if isinstance(raw, dict) else raw:
        out.append((name, value.encode() if isinstance(value, str) else value or b""))
    return tuple(out)
