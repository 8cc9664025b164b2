"""The confluent-kafka (librdkafka) settings the engine relies on, in one place.

These are plain dicts, so this module imports no Kafka client: the settings can be shown,
tested and reused (by tests, benchmarks, tools) without a connection. Each choice below is a
correctness or latency requirement of the engine, not a matter of taste; callers may add
settings through ``overrides`` but should not turn these off.
"""

from __future__ import annotations

import os
from typing import Any

from engine.adapters.kafka.logs import logging_config
from engine.config.settings import Settings
from engine.config.topics import topic_max_message_bytes
from engine.core.errors import ConfigurationError
from engine.core.keys import murmur2_partition

__all__ = [
    "BOOTSTRAP_ENV",
    "admin_config",
    "bootstrap_servers_from_env",
    "consumer_config",
    "expected_partition",
    "group_membership",
    "idempotent_producer_config",
    "processor_producer_config",
    "producer_config",
    "transactional_producer_config",
]

BOOTSTRAP_ENV = "ENGINE_BOOTSTRAP_SERVERS"

KafkaConfig = dict[str, Any]


def bootstrap_servers_from_env(default: str | None = None) -> str:
    """``$ENGINE_BOOTSTRAP_SERVERS``, else ``default``; raises when neither is set."""
    value = os.environ.get(BOOTSTRAP_ENV) or default
    if not value:
        raise ConfigurationError(
            f"no Kafka to talk to: set {BOOTSTRAP_ENV} (for example 127.0.0.1:9092), or "
            f"start a local broker with 'python -m engine dev kafka start'."
        )
    return value


def _base(bootstrap_servers: str, client_id: str | None) -> KafkaConfig:
    """Every client's common settings: where, who, and librdkafka's logs and errors routed
    through Python logging (:mod:`engine.adapters.kafka.logs`) instead of raw stderr."""
    config: KafkaConfig = {"bootstrap.servers": bootstrap_servers}
    config.update(logging_config(bootstrap_servers))
    if client_id:
        config["client.id"] = client_id
    return config


def admin_config(bootstrap_servers: str, *, client_id: str | None = None) -> KafkaConfig:
    """Settings for an ``AdminClient`` (topic creation and inspection)."""
    return _base(bootstrap_servers, client_id)


def producer_config(
    bootstrap_servers: str, *, client_id: str | None = None, **overrides: Any
) -> KafkaConfig:
    """Settings for every producer of the engine.

    - ``partitioner=murmur2_random``: keyed records land on the partition the Java client
      (and Kafka Streams, and Go clients that follow it) would choose; librdkafka's default
      (``consistent_random``, CRC32) would not, and Java and Python producers for the same
      instance would then disagree.
    - ``enable.idempotence``: no duplicates or reordering from internal retries.
    - ``linger.ms=5``: batch records of one turn without adding noticeable latency.
    - ``retry.backoff.ms=10``: the default (100 ms) is paid on back-to-back transactions
      whenever the coordinator answers "concurrent transactions", which happens constantly.
    """
    config = _base(bootstrap_servers, client_id)
    config.update(
        {
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "retry.backoff.ms": 10,
        }
    )
    config.update(overrides)
    return config


def idempotent_producer_config(
    bootstrap_servers: str, *, client_id: str | None = None, **overrides: Any
) -> KafkaConfig:
    """Settings for the activity worker's producer: idempotent, acks from all in-sync
    replicas, outside any transaction.

    The worker commits a task's offset only after the broker acknowledged every record the
    task produced, so the producer itself must neither duplicate nor reorder records on its
    internal retries and must not count a record as delivered before every in-sync replica
    has it. Overrides (``extra_kafka``) that would weaken that are refused.
    """
    config = producer_config(bootstrap_servers, client_id=client_id)
    config.update(overrides)
    weakened: dict[str, Any] = {}
    if str(config.get("enable.idempotence")).lower() != "true":
        weakened["enable.idempotence"] = config.get("enable.idempotence")
    if str(config.get("acks")).lower() not in ("all", "-1"):
        weakened["acks"] = config.get("acks")
    if "transactional.id" in config:
        weakened["transactional.id"] = config["transactional.id"]
    if weakened:
        raise ConfigurationError(
            f"the activity worker's producer must be idempotent with acks=all and no "
            f"transactional.id, but the settings give {weakened}; remove these from "
            f"extra_kafka (the worker's offsets are committed only after delivery, which "
            f"relies on them)"
        )
    return config


def transactional_producer_config(
    bootstrap_servers: str,
    transactional_id: str,
    *,
    client_id: str | None = None,
    transaction_timeout_ms: int = 60_000,
    **overrides: Any,
) -> KafkaConfig:
    """Settings for the one transactional producer of a processor or activity worker.

    ``transactional.id`` must be stable for the same unit of work across restarts (it is how
    the broker fences a zombie that still holds an open transaction). The timeout bounds how
    long a crashed producer's open transaction blocks read_committed readers.
    """
    if not transactional_id:
        raise ConfigurationError("a transactional producer needs a non-empty transactional.id")
    config = producer_config(bootstrap_servers, client_id=client_id)
    config["transactional.id"] = transactional_id
    config["transaction.timeout.ms"] = transaction_timeout_ms
    config.update(overrides)
    return config


def consumer_config(
    bootstrap_servers: str, group_id: str, *, client_id: str | None = None, **overrides: Any
) -> KafkaConfig:
    """Settings for every consumer of the engine.

    - ``isolation.level=read_committed``: never act on records of aborted transactions.
    - ``enable.auto.commit=False``: offsets are committed inside the producer's transaction
      (``send_offsets_to_transaction``), exactly when the turn's output commits.
    - ``auto.offset.reset=earliest``: a new group starts from the beginning; nothing durable
      may be skipped because no offset was committed yet.
    - ``topic.metadata.refresh.interval.ms=10000``: a subscribed topic that the broker's
      metadata did not show yet (created a moment ago) is picked up within seconds; the
      default (5 minutes) would leave such a consumer idle that long.
    - ``fetch.wait.max.ms=500`` (Kafka's default): how long the broker holds a fetch that
      finds nothing new. It answers as soon as a record (or a transaction's commit marker)
      arrives, so a long wait costs no latency, while a short one turns every idle consumer
      into a stream of empty fetches the broker must answer (10 ms: 100 a second each).
      Readers that must notice the end of a partition promptly (partition EOF) set less.
    """
    config = _base(bootstrap_servers, client_id)
    config.update(
        {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 10_000,
            "fetch.wait.max.ms": 500,
        }
    )
    config.update(overrides)
    return config


def group_membership(instance_id: str, *, static: bool = True) -> KafkaConfig:
    """How a processor replica or a worker joins its consumer group.

    Static membership (KIP-345, ``group.instance.id``): the group coordinator remembers the
    member by this id, so a process that crashed and restarts under the same id takes its
    old place and its old partitions at once - no rebalance, no waiting out the dead
    member's ``session.timeout.ms``. The id must be unique in the group (replica ids and
    worker ids are). The price: a static member that closes does not leave the group, so a
    clean stop must leave explicitly (:func:`engine.adapters.kafka.io.leave_group`), or its
    partitions would sit idle for the session timeout.
    """
    return {"group.instance.id": instance_id} if static else {}


def expected_partition(key: bytes, num_partitions: int) -> int:
    """The partition a producer built from :func:`producer_config` picks for ``key``."""
    return murmur2_partition(key, num_partitions)


#: The processor producer's longest retry backoff (ms): see :func:`processor_producer_config`.
PRODUCER_RETRY_BACKOFF_MAX_MS = 20


def processor_producer_config(settings: Settings, client_id: str) -> dict[str, Any]:
    """The processor's transactional producer: its replica's id, records up to the topics'
    size limit, and a short cap on retry backoff."""
    config = transactional_producer_config(
        settings.bootstrap_servers, client_id, transaction_timeout_ms=10_000
    )
    config.update(
        {
            "linger.ms": 1,
            "message.max.bytes": topic_max_message_bytes(settings),
            # The retries of "concurrent transactions" (the coordinator still writing
            # the last commit's markers, one per partition it touched) back off
            # exponentially from retry.backoff.ms up to this; at librdkafka's 1000 ms
            # the offsets step of a transaction over 32 partitions waited ~270 ms.
            "retry.backoff.max.ms": PRODUCER_RETRY_BACKOFF_MAX_MS,
        }
        | settings.extra_kafka
    )
    return config
