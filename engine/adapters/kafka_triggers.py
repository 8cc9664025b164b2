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
left open) and reading resumes from the committed offsets, with a growing pause.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from engine.adapters.kafka_config import (
    consumer_config,
    group_membership,
    transactional_producer_config,
)
from engine.adapters.kafka_deadline import close_within
from engine.adapters.kafka_io import TransactionalProducer, leave_group, make_consumer, poll_batch
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError
from engine.services.records import RawRecord
from engine.services.triggers import route

log = logging.getLogger("engine.triggers")

#: Records per transaction, and the longest a poll blocks (a stop is seen between polls).
MAX_BATCH = 500
POLL_S = 0.5
#: Pauses between attempts after a failed batch: doubling, at most this long.
RETRY_MAX_S = 10.0


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
                except (BrokerError, KafkaException) as exc:
                    log.warning(
                        "trigger batch abandoned, redone from the committed offsets: %s", exc
                    )
                    self._disconnect(leave=False)
                    stop.wait(pause)
                    pause = min(pause * 2, RETRY_MAX_S)
        finally:
            self._disconnect(leave=True)

    def step(self) -> int:
        """One batch: poll, produce each record's command, commit it with the offsets."""
        consumer, producer = self._consumer, self._producer
        assert consumer is not None and producer is not None, "run() connects first"
        records = [
            r for r in (self._record(m) for m in poll_batch(consumer, MAX_BATCH, POLL_S)) if r
        ]
        if not records:
            return 0
        producer.begin()
        nexts: dict[tuple[str, int], int] = {}
        for record in records:
            out = route(
                self._triggers[record.topic],
                record,
                self._names.commands,
                self._names.dead_letters,
                self.settings.max_record_bytes,
            )
            producer.produce(out.topic, out.key, out.value, None, out.headers)
            dead = out.topic == self._names.dead_letters
            self.dead_letters += dead
            self.mapped += not dead
            nexts[(record.topic, record.partition)] = record.offset + 1
        offsets = [TopicPartition(t, p, o) for (t, p), o in nexts.items()]
        producer.send_offsets(offsets, consumer.consumer_group_metadata())
        producer.commit()
        self.transactions += 1
        return len(records)

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


def _headers(message: Message) -> tuple[tuple[str, bytes], ...]:
    out: list[tuple[str, bytes]] = []
    raw = message.headers() or []
    for name, value in raw.items() if isinstance(raw, dict) else raw:
        out.append((name, value.encode() if isinstance(value, str) else value or b""))
    return tuple(out)
