"""In-memory topics for the test engine: append-only partition logs with offsets.

Each produced record gets its topic's next offset on its partition (murmur2 of the key when
the producer leaves the partition open, as every Turnstile producer does), so the records a
test reads back have the same shape as records consumed from Kafka.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from engine.core.keys import murmur2_partition
from engine.services.records import RawRecord


class MemoryTopics:
    """Every topic of one namespace, each with ``partitions`` partitions."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._logs: dict[tuple[str, int], list[RawRecord]] = defaultdict(list)

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp_ms: int,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> RawRecord:
        """Write one record; returns it with its partition and offset."""
        if partition is None:  # a record without a key (published ones may have none): 0
            partition = 0 if key is None else murmur2_partition(key, self.partitions)
        log = self._logs[(topic, partition)]
        record = RawRecord(partition, len(log), key, value, timestamp_ms, topic, headers)
        log.append(record)
        return record

    def read(self, topic: str) -> list[RawRecord]:
        """Every record of ``topic``, in partition then offset order."""
        return [r for p in range(self.partitions) for r in self._logs.get((topic, p), [])]

    def read_partition(self, topic: str, partition: int, start: int = 0) -> list[RawRecord]:
        """The records of one partition of ``topic`` from offset ``start`` on."""
        return self._logs.get((topic, partition), [])[start:]

    def end_offset(self, topic: str, partition: int) -> int:
        return len(self._logs.get((topic, partition), []))

    def __iter__(self) -> Iterator[RawRecord]:
        for records in self._logs.values():
            yield from records
