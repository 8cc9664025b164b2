"""Consumer groups as operators see them: who owns which partition, and how far behind it is.

Lag is the log end offset minus the group's committed offset. Both processors and workers
commit the position after the last record they handled (the next offset to read), so a
group that is idle and caught up reads lag 0 on every partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.adapters.kafka.config import admin_config, consumer_config
from engine.adapters.kafka.io import log_end_offsets
from engine.config.settings import Settings
from engine.core.errors import BrokerError

__all__ = ["GroupMember", "GroupView", "PartitionLag", "describe_group"]

_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class PartitionLag:
    """One partition of one topic the group consumes."""

    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        """Records not yet committed by the group (all of them if it never committed)."""
        return self.end - (self.committed or 0)


@dataclass(frozen=True)
class GroupMember:
    """One member (a processor replica or a worker) and the partitions it owns."""

    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]


@dataclass
class GroupView:
    """A consumer group's state, members and per-partition lag."""

    group: str
    state: str
    members: list[GroupMember] = field(default_factory=list)
    lags: list[PartitionLag] = field(default_factory=list)

    def owner_of(self, topic: str, partition: int) -> str:
        for member in self.members:
            if (topic, partition) in member.partitions:
                return member.client_id
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "state": self.state,
            "members": [
                {
                    "client_id": m.client_id,
                    "host": m.host,
                    "partitions": [{"topic": t, "partition": p} for t, p in m.partitions],
                }
                for m in self.members
            ],
            "partitions": [
                {
                    "topic": x.topic,
                    "partition": x.partition,
                    "committed": x.committed,
                    "end": x.end,
                    "lag": x.lag,
                    "owner": self.owner_of(x.topic, x.partition),
                }
                for x in self.lags
            ],
        }


def describe_group(settings: Settings, group: str, topics: Sequence[str]) -> GroupView:
    """Members, assignments and lag of ``group`` on ``topics`` (one admin round trip each)."""
    admin = AdminClient({**admin_config(settings.bootstrap_servers), **settings.extra_kafka})
    try:
        described = admin.describe_consumer_groups([group], request_timeout=_TIMEOUT_S)[group]
        info = described.result()
        committed_future = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=_TIMEOUT_S
        )[group]
        committed = {
            (tp.topic, tp.partition): tp.offset for tp in committed_future.result().topic_partitions
        }
        partitions = _partitions(admin, topics)
    except KafkaException as exc:
        raise BrokerError(
            f"cannot describe consumer group {group!r} at {settings.bootstrap_servers}: {exc}; "
            f"check that the broker runs and --bootstrap-servers points at it"
        ) from exc
    ends = log_end_offsets(
        consumer_config(settings.bootstrap_servers, f"{group}.observer"), partitions
    )
    view = GroupView(group, str(getattr(info.state, "name", info.state)))
    for member in info.members:
        owned = member.assignment.topic_partitions if member.assignment else []
        view.members.append(
            GroupMember(
                member.client_id,
                member.host,
                tuple(sorted((tp.topic, tp.partition) for tp in owned)),
            )
        )
    for tp in partitions:
        offset = committed.get((tp.topic, tp.partition))
        view.lags.append(
            PartitionLag(
                tp.topic,
                tp.partition,
                offset if offset is not None and offset >= 0 else None,
                ends[(tp.topic, tp.partition)][1],
            )
        )
    return view


def _partitions(admin: AdminClient, topics: Sequence[str]) -> list[TopicPartition]:
    metadata = admin.list_topics(timeout=_TIMEOUT_S).topics
    out = []
    for topic in topics:
        meta = metadata.get(topic)
        if meta is None or meta.error is not None:
            continue
        out += [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    return out
