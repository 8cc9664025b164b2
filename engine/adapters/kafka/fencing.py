"""Fence a departed owner's open transaction at once when its partitions are taken over.

A processor replica commits each batch in one transaction under its own ``transactional.id``.
When a replica dies mid-transaction, that transaction stays open until the broker times it
out (the replica's 10 s transaction timeout, then up to the broker's abort-scan interval),
and while it is open the last stable offset of every partition it wrote to stands still: the
replica that takes the partitions over cannot finish restoring their changelogs, and readers
of the outputs see nothing new. Waiting is safe but slow.

Each committed offset therefore names the transactional id that committed it and the group
member (consumer ``client.id``) it belonged to: the offset commit's metadata, written in the
same transaction. A replica that is assigned partitions
reads their committed offsets before it restores them; an owner it finds there that is not
itself and is no longer a member of the group is gone - crashed, or stalled long enough to be
thrown out - so the replica fences it: a producer under that transactional id runs
``init_transactions``, which makes the transaction coordinator abort the open transaction
now and bump the id's epoch, so the old producer, should it come back, can never commit
again. An owner still in the group is left alone: it handed the partitions over in an
ordinary rebalance, after committing, and fencing it would abort its work on the partitions
it keeps. A fenced replica that restarts under its id recovers like any fenced producer
(:mod:`engine.adapters.kafka.recovery`).

Fencing is an optimisation of time, never of correctness: when the owner cannot be read or
the group cannot be described, nothing is fenced and the restore waits for the transaction
to end, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.adapters.kafka.config import KafkaConfig

__all__ = ["Fencing", "stamped"]

log = logging.getLogger("engine.processor")

#: The offset metadata: ``owner=<transactional id> member=<consumer client.id>``.
OWNER_PREFIX = "owner="
MEMBER_PREFIX = " member="


def stamped(
    offsets: Iterable[TopicPartition], transactional_id: str, member: str
) -> list[TopicPartition]:
    """``offsets`` with the committing transactional id and group member as metadata."""
    metadata = f"{OWNER_PREFIX}{transactional_id}{MEMBER_PREFIX}{member}"
    return [TopicPartition(tp.topic, tp.partition, tp.offset, metadata=metadata) for tp in offsets]


def owners(committed: Iterable[TopicPartition]) -> dict[str, str]:
    """Transactional id -> group member, as named by committed offsets (offsets committed
    without them, by an older version or by a tool, name none)."""
    found: dict[str, str] = {}
    for tp in committed:
        text = tp.metadata or ""
        if text.startswith(OWNER_PREFIX) and MEMBER_PREFIX in text:
            owner, member = text[len(OWNER_PREFIX) :].split(MEMBER_PREFIX, 1)
            found[owner] = member
    return found


@dataclass(frozen=True)
class Fencing:
    """How one replica fences departed owners: its own transactional id, its group, and
    the settings every producer and admin client of it uses (security included)."""

    transactional_id: str
    group_id: str
    producer: KafkaConfig
    admin: KafkaConfig
    #: A consumer of the group that reads its committed offsets as read_uncommitted: a
    #: read_committed consumer asks for *stable* offsets (KIP-447), which the broker refuses
    #: while the departed owner's open transaction holds offsets for the partitions, and
    #: librdkafka retries until its timeout - the very wait fencing is there to cut short.
    #: The last committed offsets name their owner all the same. None: ask ``consumer``.
    offsets: KafkaConfig | None = None
    timeout_s: float = 10.0

    def departed(self, consumer: Consumer, partitions: Sequence[TopicPartition]) -> set[str]:
        """Transactional ids that last committed ``partitions`` and are gone from the
        group (empty when that cannot be told)."""
        try:
            found = owners(self._committed(consumer, partitions))
            found.pop(self.transactional_id, None)
            if not found:
                return set()
            admin = AdminClient(self.admin)
            (future,) = admin.describe_consumer_groups([self.group_id]).values()
            members = {m.client_id for m in future.result(timeout=self.timeout_s).members}
        except KafkaException as exc:
            log.warning("could not tell whether the partitions' last owner is gone: %s", exc)
            return set()
        return {owner for owner, member in found.items() if member not in members}

    def _committed(
        self, consumer: Consumer, partitions: Sequence[TopicPartition]
    ) -> list[TopicPartition]:
        if self.offsets is None:
            return list(consumer.committed(list(partitions), timeout=self.timeout_s))
        probe = Consumer(self.offsets | {"isolation.level": "read_uncommitted"})
        try:
            return list(probe.committed(list(partitions), timeout=self.timeout_s))
        finally:
            probe.close()

    def fence(self, transactional_id: str) -> bool:
        """Abort whatever ``transactional_id`` left open and fence it; whether that worked."""
        config = dict(self.producer)
        config["transactional.id"] = transactional_id
        producer = Producer(config)
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            log.warning(
                "could not fence %s (the restore waits for its transaction to time out): %s",
                transactional_id,
                exc,
            )
            return False
        finally:
            producer.flush(0)
        log.info("fenced %s: it left the group, its open transaction is aborted", transactional_id)
        return True
