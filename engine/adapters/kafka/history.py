"""Read engine topics to their end, for the audit tools (history, changelog, status), ``list``
and the dashboard.

A read is ``read_committed`` (records of aborted or still open transactions are never
seen), assigns partitions explicitly (no consumer group membership, no committed offsets:
reading changes nothing) and has a definite end, fixed when it starts, so a busy topic
cannot keep it going forever. Which end is the reader's choice (:class:`ReadEnd`):

- ``LOG_END``, for audits that must see every committed record (``history verify`` must
  find a fork): the log end offset, asked as a read_uncommitted reader sees it. A
  read_committed reader's own end (the last stable offset) stops at the first transaction
  still open, and records committed after it would be missed; so while such a transaction
  is open the read waits for it (it ends at the latest at the broker's transaction timeout).
- ``LAST_STABLE``, for reads that answer a user now (``list``, ``history show``, the
  dashboard): the last stable offset, everything committed before the first transaction
  still open. It waits for no transaction, however busy the partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import Enum
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from engine.adapters.kafka.client import partition_count
from engine.adapters.kafka.config import consumer_config
from engine.adapters.kafka.io import log_end_offsets, poll_batch, stable_end_offsets
from engine.adapters.schema_registry import connect_schema_registry
from engine.codec import decode_history
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError, CodecError
from engine.core.history import HistoryEvent
from engine.core.keys import instance_key, murmur2_partition
from engine.services.audit.records import RawRecord, ReadProgress

__all__ = ["ProgressCallback", "ReadEnd", "TopicReader", "read_instance_history"]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[ReadProgress], None]

_BATCH = 5000
_POLL_S = 0.5
_METADATA_TIMEOUT_S = 10.0
#: Records may carry a producer timestamp slightly before the event's own time; seeking by
#: time starts this much earlier so that no event inside the range is skipped.
_TIME_SEEK_MARGIN_MS = 5 * 60 * 1000


class ReadEnd(Enum):
    """Where a read of a partition ends, fixed when the read starts."""

    #: The log end offset: every record committed, those of transactions open at the start
    #: included (the read waits for them to end).
    LOG_END = "log end"
    #: The last stable offset: what was committed before the first transaction still open
    #: at the start (the read waits for none).
    LAST_STABLE = "last stable offset"


class TopicReader:
    """Reads whole partitions of engine topics; remembers where each read ended.

    ``end``: where each read ends (:class:`ReadEnd`). ``stall_timeout_s`` bounds how long a
    read may go without any record or end-of-partition event before it gives up (a broker
    that went away, a partition without a leader).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        end: ReadEnd = ReadEnd.LOG_END,
        progress_every_s: float = 1.0,
        stall_timeout_s: float = 60.0,
    ) -> None:
        self.settings = settings
        self.end = end
        self.progress_every_s = progress_every_s
        self.stall_timeout_s = stall_timeout_s
        connect_schema_registry(settings)  # history and status may be registry-framed
        #: topic -> partition -> the offset the last read of it stopped at (the next one).
        self.positions: dict[str, dict[int, int]] = {}
        self._consumer = Consumer(
            consumer_config(
                settings.bootstrap_servers,
                f"{settings.namespace}.audit",
                client_id=f"{settings.namespace}.audit",
                **{"enable.partition.eof": True, "fetch.wait.max.ms": 50, **settings.extra_kafka},
            )
        )

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- metadata ---------------------------------------------------------------------------

    def partition_count(self, topic: str) -> int:
        return partition_count(self._consumer, topic, _METADATA_TIMEOUT_S)

    def partition_of(self, topic: str, instance_id: str) -> int:
        """The partition that holds ``instance_id`` (murmur2 of its key, as producers do)."""
        return murmur2_partition(instance_key(instance_id), self.partition_count(topic))

    # --- reading ----------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        start: Mapping[int, int] | None = None,
        since_ms: int | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Iterator[RawRecord]:
        """Every committed record of ``partitions`` (default: all), in offset order per
        partition, from ``start`` (default: the beginning, or about ``since_ms``) to the end
        as of now. ``self.positions[topic]`` holds where the read stopped, to continue later."""
        if partitions is None:
            partitions = range(self.partition_count(topic))
        bounds = self._bounds(topic, partitions, start or {}, since_ms)
        positions = self.positions.setdefault(topic, {})
        positions.update({p: first for p, (first, high) in bounds.items() if first >= high})
        pending = {p: high for p, (first, high) in bounds.items() if first < high}
        expected = sum(high - first for first, high in bounds.values())
        tracker = _Progress(topic, expected, len(bounds), self.progress_every_s, on_progress)
        if pending:
            self._consumer.assign([TopicPartition(topic, p, bounds[p][0]) for p in pending])
            try:
                yield from self._drain(topic, pending, positions, tracker)
            finally:
                self._consumer.unassign()
        tracker.report(len(bounds) - len(pending), force=True)

    def _bounds(
        self,
        topic: str,
        partitions: Sequence[int],
        start: Mapping[int, int],
        since_ms: int | None,
    ) -> dict[int, tuple[int, int]]:
        """Per partition: the first offset to read and the end (``self.end``) now."""
        out = {}
        ends = self._ends([TopicPartition(topic, p) for p in partitions])
        try:
            for p in partitions:
                low, high = ends[(topic, p)]
                first = max(low, start.get(p, low))
                if since_ms is not None and p not in start:
                    first = max(first, self._offset_at(topic, p, since_ms, high))
                out[p] = (first, high)
        except KafkaException as exc:
            raise _broker_error(topic, exc) from exc
        return out

    def _ends(self, partitions: list[TopicPartition]) -> dict[tuple[str, int], tuple[int, int]]:
        if self.end is ReadEnd.LAST_STABLE:
            return stable_end_offsets(self._consumer, partitions, timeout_s=_METADATA_TIMEOUT_S)
        config = consumer_config(
            self.settings.bootstrap_servers,
            f"{self.settings.namespace}.audit",
            **self.settings.extra_kafka,
        )
        return log_end_offsets(config, partitions, timeout_s=_METADATA_TIMEOUT_S)

    def _offset_at(self, topic: str, partition: int, since_ms: int, high: int) -> int:
        wanted = TopicPartition(topic, partition, max(0, since_ms - _TIME_SEEK_MARGIN_MS))
        found = self._consumer.offsets_for_times([wanted], _METADATA_TIMEOUT_S)[0]
        return high if found.offset < 0 else int(found.offset)

    def _drain(
        self,
        topic: str,
        pending: dict[int, int],
        positions: dict[int, int],
        tracker: _Progress,
    ) -> Iterator[RawRecord]:
        last_activity = time.monotonic()
        while pending:
            messages = poll_batch(self._consumer, _BATCH, _POLL_S)
            if messages:
                last_activity = time.monotonic()
            elif time.monotonic() - last_activity > self.stall_timeout_s:
                raise BrokerError(
                    f"reading {topic} stalled: no record for {self.stall_timeout_s:.0f}s with "
                    f"partitions {sorted(pending)} unfinished; check that the brokers are up, "
                    f"or wait until an open transaction on them ends and read again"
                )
            for message in messages:
                record = self._record(topic, message, pending, positions)
                if record is not None:
                    tracker.records += 1
                    yield record
            tracker.report(tracker.partitions - len(pending))

    def _record(
        self,
        topic: str,
        message: Message,
        pending: dict[int, int],
        positions: dict[int, int],
    ) -> RawRecord | None:
        partition = message.partition() or 0
        offset = message.offset() or 0
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                positions[partition] = offset
                if partition in pending and offset >= pending[partition]:
                    pending.pop(partition)
                elif partition in pending:
                    log.info(
                        "%s[%d]: waiting for an open transaction (committed records read up "
                        "to %d, the log ends at %d)",
                        topic,
                        partition,
                        offset,
                        pending[partition],
                    )
                return None
            raise _broker_error(topic, KafkaException(error))
        if partition not in pending:
            return None  # past this read's end (the read ended on the high watermark)
        if offset >= pending[partition]:  # past the end: the next read starts with it
            positions[partition] = offset
            pending.pop(partition)
            return None
        positions[partition] = offset + 1
        if offset + 1 >= pending[partition]:
            pending.pop(partition)
        return RawRecord(partition, offset, message.key(), message.value(), message.timestamp()[1])


class _Progress:
    def __init__(
        self,
        topic: str,
        expected: int,
        partitions: int,
        every_s: float,
        callback: ProgressCallback | None,
    ) -> None:
        self.topic = topic
        self.expected = expected
        self.partitions = partitions
        self.every_s = every_s
        self.callback = callback
        self.records = 0
        self.started = time.monotonic()
        self._last = self.started

    def report(self, partitions_done: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.callback is None or (not force and now - self._last < self.every_s):
            return
        self._last = now
        self.callback(
            ReadProgress(
                self.topic,
                self.records,
                self.expected,
                partitions_done,
                self.partitions,
                now - self.started,
            )
        )


def read_instance_history(
    settings: Settings, instance_id: str, *, on_progress: ProgressCallback | None = None
) -> list[HistoryEvent]:
    """Every event of one instance committed when the read starts, in order, from the
    history topic (only its partition is read, to its last stable offset: a busy partition
    does not hold it up). Records that do not decode are logged and left out (``history
    verify`` names them)."""
    topic = topic_names(settings.namespace).history
    key = instance_key(instance_id)
    events = []
    with TopicReader(settings, end=ReadEnd.LAST_STABLE) as reader:
        partition = reader.partition_of(topic, instance_id)
        for record in reader.read(topic, [partition], on_progress=on_progress):
            if record.key != key or record.value is None:
                continue
            try:
                events.append(decode_history(record.value))
            except CodecError as exc:
                log.warning("%s offset %d is not a history event: %s", topic, record.offset, exc)
    return events


def _broker_error(topic: str, exc: KafkaException) -> BrokerError:
    error: Any = exc.args[0] if exc.args else exc
    return BrokerError(
        f"cannot read {topic}: {error}. Check --bootstrap-servers and --namespace (the topic "
        f"must exist: 'turnstile topics apply' creates it)."
    )
