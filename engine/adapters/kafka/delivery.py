"""The activity worker's producer: idempotent, outside transactions, one report per record.

The worker does not wrap its output in transactions: a task's offset is committed only after
the broker acknowledged every record the task produced (see ``engine.services.worker.worker``), so
what the worker needs from its producer is an answer per record - delivered, refused for
good, or not delivered (try again) - and a producer that never duplicates or reorders on its
own retries (``enable.idempotence``, ``acks=all``).

:class:`DeliveryProducer` gives exactly that. Every ``produce`` ends in exactly one call of
its ``on_done`` with the outcome, served on the thread that calls :meth:`poll` or
:meth:`flush` (the worker's loop). A producer that failed fatally (librdkafka's idempotence
state is lost) is replaced; the records it still held are reported as not delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from engine.adapters.kafka.deadline import close_within
from engine.adapters.kafka.io import (
    RecordRejectedError,
    is_fatal,
    kafka_error,
    produce_with_room,
)

__all__ = ["DeliveryProducer", "Outcome", "is_fatal", "is_refusal"]

log = logging.getLogger(__name__)

#: What ``on_done`` receives: None when delivered, else the error.
Outcome = KafkaError | None
Headers = Sequence[tuple[str, bytes]]

#: Errors that refuse the record itself: producing it again gets the same answer.
_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
    }
)


def is_refusal(error: KafkaError) -> bool:
    """Whether the broker refused the record for good (too large, invalid, not allowed)."""
    return error.code() in _REFUSALS


class DeliveryProducer:
    """An idempotent producer that reports each record's outcome to its own callback."""

    def __init__(
        self,
        config: dict[str, Any],
        name: str,
        *,
        queue_full_s: float = 10.0,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        self._config = dict(config)
        self.name = name
        self.queue_full_s = queue_full_s
        self._factory = producer_factory
        self._producer = producer_factory(self._config)
        self.recreated = 0
        self._failed = False

    @property
    def outstanding(self) -> int:
        """Records handed to the producer whose outcome was not reported yet."""
        return len(self._producer)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        on_done: Callable[[Outcome], None],
        *,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Queue one record; ``on_done`` reports its outcome later (from :meth:`poll`).

        Raises :class:`RecordRejectedError` when the producer refuses the record up front
        (too large for ``message.max.bytes``, say); a full local queue that does not drain
        within ``queue_full_s`` is reported through ``on_done`` as not delivered.
        """

        def report(error: KafkaError | None, _message: Message) -> None:
            if is_fatal(error):
                self._failed = True
            on_done(error)

        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": report}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers)
        while True:
            if self._failed:
                self._replace()
            try:
                if not produce_with_room(self._producer, topic, kwargs, self.queue_full_s):
                    on_done(KafkaError(KafkaError._TIMED_OUT, "the producer queue stayed full"))
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                if is_fatal(error):
                    self._failed = True
                    continue
                raise RecordRejectedError(f"record for topic {topic!r} was refused: {exc}") from exc

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve the outcomes that arrived; replace the producer if it failed fatally."""
        self._producer.poll(timeout_s)
        if self._failed:
            self._replace()

    def flush(self, timeout_s: float) -> int:
        """Wait (bounded) until every record's outcome was reported; returns how many are
        still outstanding."""
        left = int(self._producer.flush(timeout_s))
        if self._failed:
            self._replace()
        return left

    def _replace(self) -> None:
        """A fatal error left the producer unusable: the records it still holds are reported
        as not delivered (the caller produces them again) and a new producer takes over."""
        log.warning("the producer %s failed fatally; replacing it", self.name)
        old, self._failed = self._producer, False
        try:
            old.purge(True, True, False)
        except (KafkaException, RuntimeError) as exc:
            log.debug("purging the failed producer failed (ignored): %s", exc)
        old.poll(0)  # the purged records' outcomes: not delivered
        close_within(f"closing the failed producer {self.name}", old.flush, 1.0)
        self._producer = self._factory(self._config)
        self.recreated += 1

    def close(self, timeout_s: float) -> int:
        """Deliver what is outstanding (bounded), then drop the rest; returns how many
        records were dropped (their tasks' offsets were not committed)."""
        left = self.flush(timeout_s)
        if left:
            try:
                self._producer.purge(True, True, False)
                self._producer.poll(0)
            except (KafkaException, RuntimeError) as exc:
                log.debug("purging the producer failed (ignored): %s", exc)
        return left
