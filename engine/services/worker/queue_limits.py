"""Fleet-wide limits of one task queue, enforced per partition of its topic.

A partition of a queue's topic is owned by exactly one worker of the group at a time, so a
limit split across the partitions holds for the whole fleet without any coordination: with
``P`` partitions, partition ``p`` may run ``K // P`` attempts at once (one more for the
first ``K % P``) and start ``N / P`` per second (a token bucket). Whatever the number of
workers and however the partitions move between them, the sum never exceeds ``K`` running
and ``N`` per second. The price: a queue whose tasks crowd onto few partitions (few
instances) gets less than its limit. A concurrency limit below the partition count would
leave partitions with no slot at all, so it is refused; give such a queue fewer partitions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.errors import ConfigurationError

__all__ = ["QueueLimits"]


@dataclass
class _Bucket:
    tokens: float
    at: float


class QueueLimits:
    """Per-partition shares of a queue's rate (starts per second) and concurrency."""

    def __init__(
        self,
        rate: float = 0.0,
        concurrency: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate < 0 or concurrency < 0:
            raise ConfigurationError("task queue limits must not be negative")
        self.rate = rate
        self.concurrency = concurrency
        self._clock = clock
        self._partitions = 1
        self._running: dict[int, int] = {}
        self._buckets: dict[int, _Bucket] = {}

    @property
    def active(self) -> bool:
        return self.rate > 0 or self.concurrency > 0

    def set_partitions(self, partitions: int, queue: str = "") -> None:
        if self.concurrency and self.concurrency < partitions:
            raise ConfigurationError(
                f"task queue {queue!r} has {partitions} partitions but a concurrency limit of "
                f"{self.concurrency}: some partitions would get no slot. Give the queue's "
                f"topic at most {self.concurrency} partitions, or raise the limit"
            )
        self._partitions = max(partitions, 1)

    def slots(self, partition: int) -> int:
        k, p = self.concurrency, self._partitions
        return k // p + (1 if partition % p < k % p else 0)

    def may_start(self, partition: int) -> bool:
        if self.concurrency and self._running.get(partition, 0) >= self.slots(partition):
            return False
        return not self.rate or self._bucket(partition).tokens >= 1

    def started(self, partition: int) -> None:
        self._running[partition] = self._running.get(partition, 0) + 1
        if self.rate:
            self._bucket(partition).tokens -= 1

    def finished(self, partition: int) -> None:
        self._running[partition] = max(self._running.get(partition, 0) - 1, 0)

    def _bucket(self, partition: int) -> _Bucket:
        share = self.rate / self._partitions
        now = self._clock()
        bucket = self._buckets.get(partition)
        if bucket is None:
            bucket = self._buckets[partition] = _Bucket(min(1.0, share), now)
        bucket.tokens = min(max(share, 1.0), bucket.tokens + (now - bucket.at) * share)
        bucket.at = now
        return bucket
