"""A batch's transaction finishing on a thread of its own while the loop runs the next turns.

After step 6 (the batch's records produced) the rest of a transaction is waiting: adding
the consumed offsets (two coordinator round trips) and the commit (the records' delivery,
then EndTxn). The processor's one Python thread has the next batch's turns to run, so the
:class:`Committer` runs those two calls on a thread of its own (they spend their time in
librdkafka, without the interpreter lock) and the loop collects the outcome before it
starts the next transaction.

Why this is still exactly-once (ARCHITECTURE, "The commit protocol"): the next batch's
turns read the previous batch's changes from the tables' pending layer, never from the
store, so nothing reaches RocksDB before its transaction committed; the next batch's own
transaction begins only after the previous one's outcome is known, so the transactions
of a replica stay one at a time and in order; and when a transaction aborts, every batch
after it is dropped too (it was built on the aborted one) and the consumer seeks back to
the aborted batch's first offsets, so both are simply done again.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from engine.adapters.kafka.io import Delivered, TransactionalProducer
from engine.adapters.kafka.isolation import Produced
from engine.config.topics import TopicNames
from engine.services.processor.batch import Batch
from engine.services.processor.tables import STATE_CHANGELOG, TIMER_CHANGELOG

__all__ = ["Committed", "Committer", "InFlight", "changelog_offsets"]


@dataclass(frozen=True, slots=True)
class Committed:
    """A transaction's outcome: where its records were written, and what each call took."""

    delivered: list[Delivered]
    offsets_s: float
    commit_s: float


@dataclass(frozen=True, slots=True)
class InFlight:
    """A closed batch whose transaction is committing on the :class:`Committer`."""

    batches: dict[int, Batch]
    outputs: list[Produced]
    offsets: list[TopicPartition]
    outcome: Future[Committed]


class Committer:
    """Runs the offsets and commit calls of one transaction at a time, off the loop."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"commit-{name}")

    def start(
        self, producer: TransactionalProducer, offsets: list[TopicPartition], group: object
    ) -> Future[Committed]:
        """Send ``offsets`` into the open transaction and commit it, on the thread; the
        future holds the outcome or the error ``send_offsets``/``commit`` raised."""

        def finish() -> Committed:
            t = time.monotonic()
            if offsets:
                producer.send_offsets(offsets, group)
            sent = time.monotonic()
            delivered = producer.commit()
            return Committed(delivered, sent - t, time.monotonic() - sent)

        return self._pool.submit(finish)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def changelog_offsets(delivered: list[Delivered], topics: TopicNames) -> dict[int, dict[str, int]]:
    """The highest offset a transaction wrote to each partition's two changelogs (what its
    tables record as reached when the changes are applied)."""
    names = {topics.state_changelog: STATE_CHANGELOG, topics.timer_changelog: TIMER_CHANGELOG}
    reached: dict[int, dict[str, int]] = defaultdict(dict)
    for d in delivered:
        name = names.get(d.topic)
        if name is not None and d.offset > reached[d.partition].get(name, -1):
            reached[d.partition][name] = d.offset
    return reached
