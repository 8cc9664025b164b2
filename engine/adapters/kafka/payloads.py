"""The payloads topic: writing large payloads as chunks, reading them back, deleting them.

:class:`KafkaPayloadStore` is what the pure core's references (``engine.core.payload_refs``)
rely on. Writing: the chunks go to the owning instance's partition, keyed
``<instance>/<sha256>/<i>``, and are flushed before the reference is made, so the delivery
report gives the first chunk's offset and the reference is produced only once every chunk
is acknowledged - a reader that sees the reference finds the chunks. Inside a transaction
(:meth:`KafkaPayloadStore.put_in`) they share the transaction with the record carrying the
reference and become visible with it. Reading: a consumer without a group is assigned the
reference's partition at its offset and reads forward (read_committed) until it has every
chunk; compaction keeps the newest copy of a key, which is never before the offset a
reference recorded. Fetched payloads are cached (bounded by bytes, outside any cache budget
of the processor's instance state). Deleting: tombstones for every chunk key of an instance
(:meth:`KafkaPayloadStore.tombstones`), which compaction then removes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from engine.adapters.kafka.config import consumer_config, idempotent_producer_config
from engine.adapters.kafka.io import TransactionalProducer
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError
from engine.core.keys import partition_for_instance
from engine.core.payload_refs import (
    CHUNK_BYTES,
    PayloadRef,
    PayloadRefError,
    chunk_key,
    digest,
    install_fetcher,
    make_ref,
    split_chunks,
)
from engine.core.payloads import Payload, ref_payload

__all__ = ["KafkaPayloadStore", "payload_store"]

log = logging.getLogger(__name__)

#: Bytes of fetched payloads kept in memory per process (least recently used go first).
_CACHE_BYTES = 256 * 1024 * 1024
_FETCH_TIMEOUT_S = 60.0
_DELIVERY_TIMEOUT_S = 120.0


class KafkaPayloadStore:
    """Writes, reads and deletes the chunks of large payloads on one payloads topic.

    Thread-safe: a worker's activity threads write through it at once, and readers share
    one consumer under a lock."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        extra_kafka: dict[str, Any] | None = None,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        cache_bytes: int = _CACHE_BYTES,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.extra_kafka = dict(extra_kafka or {})
        self.chunk_bytes = chunk_bytes
        self._cache_bytes = cache_bytes
        self._cache: OrderedDict[str, list[bytes]] = OrderedDict()
        self._cached = 0
        self._partitions = 0
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()

    # --- writing ----------------------------------------------------------------------------

    def partition_of(self, owner: str) -> int:
        """The payloads partition of instance ``owner`` (murmur2, as for every topic)."""
        if not self._partitions:
            self._partitions = self._partition_count()
        return partition_for_instance(owner, self._partitions)

    def put(self, owner: str, payload: Payload) -> Payload:
        """Write ``payload``'s chunks (acknowledged by the broker when this returns) and give
        the reference to put in the record instead; outside any transaction (a worker's
        result, a client's command)."""
        chunks = split_chunks(payload.data, self.chunk_bytes)
        partition = self.partition_of(owner)
        sha = digest(payload.data)
        with self._write_lock:
            producer = self._writer()
            offsets: list[int] = []
            errors: list[str] = []

            def report(error: KafkaError | None, message: Message) -> None:
                if error is not None:
                    errors.append(str(error))
                else:
                    offsets.append(message.offset() or 0)

            for i, chunk in enumerate(chunks):
                self._produce(producer, chunk_key(owner, sha, i), chunk, partition, report)
            deadline = time.monotonic() + _DELIVERY_TIMEOUT_S
            while len(offsets) + len(errors) < len(chunks) and time.monotonic() < deadline:
                producer.poll(0.1)
        if errors or len(offsets) < len(chunks):
            raise BrokerError(
                f"the chunks of a {len(payload.data)}-byte payload could not be written to "
                f"{self.topic} ({errors[0] if errors else 'no acknowledgement in time'}); "
                f"check that the topic exists (turnstile topics apply) and the brokers are up"
            )
        self._remember(sha, chunks)
        return ref_payload(
            make_ref(
                owner,
                payload.data,
                payload.encoding,
                len(chunks),
                self.topic,
                partition,
                min(offsets),
            )
        )

    def put_in(self, producer: TransactionalProducer, owner: str, payload: Payload) -> Payload:
        """Write ``payload``'s chunks in ``producer``'s open transaction and give the
        reference; they become visible when the transaction commits, with the record that
        carries the reference (the processor's turn)."""
        chunks = split_chunks(payload.data, self.chunk_bytes)
        partition = self.partition_of(owner)
        sha = digest(payload.data)
        before = len(producer.delivered)
        for i, chunk in enumerate(chunks):
            producer.produce(self.topic, chunk_key(owner, sha, i), chunk, partition=partition)
        producer.flush_delivered()
        ours = [d.offset for d in producer.delivered[before:] if d.topic == self.topic]
        self._remember(sha, chunks)
        offset = min(ours) if ours else 0
        return ref_payload(
            make_ref(
                owner, payload.data, payload.encoding, len(chunks), self.topic, partition, offset
            )
        )

    def tombstones(self, refs: list[PayloadRef]) -> list[tuple[bytes, int]]:
        """The (key, partition) of every chunk of ``refs``: the caller produces a tombstone
        (a null value) for each, in the transaction that purges their instance."""
        out: list[tuple[bytes, int]] = []
        for ref in refs:
            out.extend((key, ref.partition) for key in ref.chunk_keys())
            self._forget(ref.sha256)
        return out

    def delete(self, refs: list[PayloadRef]) -> int:
        """Produce the tombstones of ``refs`` outside any transaction; returns how many."""
        marks = self.tombstones(refs)
        with self._write_lock:
            producer = self._writer()
            for key, partition in marks:
                self._produce(producer, key, None, partition, None)
            left = producer.flush(_DELIVERY_TIMEOUT_S)
        if left:
            raise BrokerError(f"{left} tombstones for {self.topic} were not acknowledged in time")
        return len(marks)

    def _produce(
        self, producer: Producer, key: bytes, value: bytes | None, partition: int, report: Any
    ) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value, "partition": partition}
        if report is not None:
            kwargs["on_delivery"] = report
        while True:
            try:
                producer.produce(self.topic, **kwargs)
                return
            except BufferError:
                producer.poll(0.05)

    def _writer(self) -> Producer:
        if self._producer is None:
            config = idempotent_producer_config(self.bootstrap_servers, **self.extra_kafka)
            self._producer = Producer(config)
        return self._producer

    def end_offset(self, partition: int) -> int:
        """The end of ``partition`` now: what the next record written to it gets at least
        (a turn's chunks, produced later in its transaction, are at or after it)."""
        tp = TopicPartition(self.topic, partition)
        with self._read_lock:
            try:
                _low, high = self._reader().get_watermark_offsets(tp, timeout=10.0)
            except KafkaException as exc:
                raise BrokerError(
                    f"cannot read the end of {self.topic}[{partition}]: {exc}"
                ) from exc
        return int(high)

    # --- reading ----------------------------------------------------------------------------

    def fetch(self, ref: PayloadRef, count: int | None = None) -> list[bytes]:
        """The first ``count`` chunks of ``ref`` (None: all), in order; the core checks them
        (``payload_refs.assemble``)."""
        cached = self._cache.get(ref.sha256)
        if cached is not None:
            return cached if count is None else cached[:count]
        wanted = ref.chunks if count is None else min(count, ref.chunks)
        keys = {key: i for i, key in enumerate(ref.chunk_keys()[:wanted])}
        with self._read_lock:
            found = self._read(ref, keys)
        chunks = [found[i] for i in range(wanted)]
        if count is None:
            self._remember(ref.sha256, chunks)
        return chunks

    def _read(self, ref: PayloadRef, keys: dict[bytes, int]) -> dict[int, bytes]:
        consumer = self._reader()
        tp = TopicPartition(ref.topic, ref.partition, ref.offset)
        consumer.assign([tp])
        try:
            found: dict[int, bytes] = {}
            deadline = time.monotonic() + _FETCH_TIMEOUT_S
            while len(found) < len(keys) and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                error = None if message is None else message.error()
                if message is None or error is not None:
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        raise BrokerError(f"reading {ref.topic}: {error}")
                    if _at_end(consumer, tp):
                        break
                    continue  # held at another producer's open transaction: it ends soon
                index = keys.get(message.key() or b"")
                if index is not None and message.value() is not None:
                    found[index] = message.value() or b""
        except KafkaException as exc:
            raise BrokerError(f"reading {ref.topic}: {exc}") from exc
        finally:
            consumer.unassign()
        if len(found) < len(keys):
            raise PayloadRefError(
                f"payload {ref.sha256[:12]} of instance {ref.owner!r} is gone from "
                f"{ref.topic} partition {ref.partition} ({len(found)} of {len(keys)} chunks "
                f"found from offset {ref.offset}): the instance was purged, or the topic was "
                f"deleted; nothing can bring the value back"
            )
        return found

    def _reader(self) -> Consumer:
        if self._consumer is None:
            config = consumer_config(
                self.bootstrap_servers,
                "turnstile-payload-reader",
                **{**self.extra_kafka, "enable.partition.eof": True, "fetch.wait.max.ms": 100},
            )
            self._consumer = Consumer(config)
        return self._consumer

    # --- cache and lifecycle ----------------------------------------------------------------

    def _remember(self, sha: str, chunks: list[bytes]) -> None:
        size = sum(len(c) for c in chunks)
        if size > self._cache_bytes // 4:
            return  # one payload never pushes out everything else
        with self._read_lock:
            if sha in self._cache:
                return
            self._cache[sha] = chunks
            self._cached += size
            while self._cached > self._cache_bytes:
                _, old = self._cache.popitem(last=False)
                self._cached -= sum(len(c) for c in old)

    def _forget(self, sha: str) -> None:
        old = self._cache.pop(sha, None)
        if old is not None:
            self._cached -= sum(len(c) for c in old)

    def _partition_count(self) -> int:
        producer = self._writer()
        try:
            metadata = producer.list_topics(self.topic, timeout=10.0)
        except KafkaException as exc:
            raise BrokerError(f"cannot read the metadata of {self.topic}: {exc}") from exc
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise BrokerError(
                f"topic {self.topic} does not exist; create it with `turnstile topics apply` "
                f"(large payloads are kept there)"
            )
        return len(topic.partitions)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10.0)
        if self._consumer is not None:
            self._consumer.close()


def _at_end(consumer: Consumer, tp: TopicPartition) -> bool:
    """Whether ``consumer`` read ``tp`` to its end. A read_committed reader also stops
    short of it, at the first offset of a transaction still open: what follows is read
    once that transaction ends, so only the true end means a chunk is not there."""
    _low, high = consumer.get_watermark_offsets(tp, timeout=10.0)
    (position,) = consumer.position([tp])
    return position.offset >= high


_STORES: dict[tuple[str, str], KafkaPayloadStore] = {}
_STORES_LOCK = threading.Lock()


def payload_store(settings: Settings) -> KafkaPayloadStore:
    """The process's store for the settings' cluster and namespace (one producer and one
    reader however many clients and loops share them), installed as the process's reader
    of references (``payload_refs.install_fetcher``). Nothing connects before first use."""
    where = (settings.bootstrap_servers, settings.namespace)
    with _STORES_LOCK:
        store = _STORES.get(where)
        if store is None:
            store = KafkaPayloadStore(
                settings.bootstrap_servers,
                topic_names(settings.namespace).payloads,
                dict(settings.extra_kafka),
            )
            _STORES[where] = store
    install_fetcher(store)
    return store
