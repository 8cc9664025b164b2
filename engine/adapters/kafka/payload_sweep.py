"""``topics sweep-payloads``: tombstones for chunks on the payloads topic that no instance
can need any more.

Purge deletes the chunks an instance's current history refers to; a few are left behind by
design (the chunks of generations before a continue-as-new, a start refused after its
client wrote the input's chunks, a worker that died between a result's chunks and the
result when the retry's result differs). The sweep reads the status topic (which instances
exist) and the payloads topic (the newest record of every chunk key), both to their
current end, and writes a tombstone for every chunk whose owner has no status and that is
older than a grace period (``core.payload_refs.orphaned_chunks`` decides).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Producer

from engine.adapters.kafka.config import idempotent_producer_config
from engine.adapters.kafka.history import TopicReader
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import BrokerError
from engine.core.payload_refs import orphaned_chunks, owner_of

__all__ = ["Sweep", "sweep_payloads"]


@dataclass(frozen=True)
class Sweep:
    """What a sweep found (and, unless a dry run, deleted)."""

    chunks: int
    orphans: int
    owners: int
    deleted: bool


def sweep_payloads(settings: Settings, *, grace_ms: int, dry_run: bool = False) -> Sweep:
    """Find the orphaned chunks and, unless ``dry_run``, write their tombstones."""
    topics = topic_names(settings.namespace)
    started_ms = int(time.time() * 1000)
    live: set[str] = set()
    latest: dict[bytes, tuple[int, int, bool]] = {}
    with TopicReader(settings) as reader:
        for record in reader.read(topics.status):
            owner = (record.key or b"").decode("utf-8", "replace")
            if record.value is None:
                live.discard(owner)
            else:
                live.add(owner)
        for record in reader.read(topics.payloads):
            if record.key is not None:
                latest[record.key] = (
                    record.partition,
                    record.timestamp_ms,
                    record.value is not None,
                )
    orphans = orphaned_chunks(latest, live, started_ms - grace_ms)
    owners = {owner_of(key) for key, _ in orphans}
    if orphans and not dry_run:
        _tombstones(settings, topics.payloads, orphans)
    alive = sum(1 for _, _, value in latest.values() if value)
    return Sweep(alive, len(orphans), len(owners), bool(orphans) and not dry_run)


def _tombstones(settings: Settings, topic: str, marks: list[tuple[bytes, int]]) -> None:
    producer = Producer(
        idempotent_producer_config(settings.bootstrap_servers, **settings.extra_kafka)
    )
    for key, partition in marks:
        while True:
            try:
                producer.produce(topic, key=key, value=None, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(60.0)
    if left:
        raise BrokerError(f"{left} tombstones for {topic} were not acknowledged within 60 s")
