"""How processor replicas join their consumer group, under each ``group_protocol``.

``classic``: librdkafka's eager ``range`` assignor (it assigns the same partition number of
the three input topics to one replica, which the engine needs), static membership (a
restarted replica gets its partitions back at once) and a short session the replica asks
for itself. Every rebalance revokes every partition of every replica, and each takes its
share back: the cost is a pause of all partitions, not a restore (local tables are kept).

``consumer`` (KIP-848, Kafka 4.0+): the broker assigns, with its ``range`` assignor, which
keeps the input topics co-partitioned and moves only the partitions that change owner, so a
replica joining or leaving stops nothing else. Session timeout and heartbeat interval belong
to the group on the broker (``consumer.session.timeout.ms``, ``consumer.heartbeat.interval.ms``);
:func:`tune_group` asks for short ones, within the broker's floors
(``group.consumer.min.session.timeout.ms``, 45 s by default, and
``group.consumer.min.heartbeat.interval.ms``, 5 s). Replicas join as dynamic members: the
broker refuses a member under a static id whose earlier member has not left
(``UNRELEASED_INSTANCE_ID``), so a crashed replica restarting under its static id would be
kept out until the session ends, and liveness eviction (which replaces a silent member under
its id) cannot work. A crashed replica's partitions therefore move after the session timeout.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from engine.adapters.kafka.config import admin_config, group_membership
from engine.config.settings import CONSUMER_GROUP_PROTOCOL, Settings

__all__ = [
    "CLASSIC_PROCESSOR_CONSUMER",
    "GROUP_TIMING",
    "announce",
    "processor_group_config",
    "tune_group",
    "uses_consumer_protocol",
]

log = logging.getLogger(__name__)

#: A short session so a crashed replica's partitions move on quickly; heartbeats well
#: inside it (the fetch wait is the default: the broker answers a fetch as records arrive).
#: A member learns that a rebalance started from its next heartbeat's answer, so the
#: interval bounds how long the others wait for it when partitions move (a failover's
#: rebalance included): 300 ms, three or so small requests a second per replica.
CLASSIC_PROCESSOR_CONSUMER: dict[str, Any] = {
    "max.poll.interval.ms": 300_000,
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 300,
}

#: The same timing as group configs, for the ``consumer`` protocol (set on the broker).
GROUP_TIMING = {
    "consumer.session.timeout.ms": "10000",
    "consumer.heartbeat.interval.ms": "300",
}

_TIMEOUT_S = 10.0


def uses_consumer_protocol(settings: Settings) -> bool:
    return settings.group_protocol == CONSUMER_GROUP_PROTOCOL


def processor_group_config(settings: Settings) -> dict[str, Any]:
    """The consumer settings of group membership for a processor replica."""
    if uses_consumer_protocol(settings):
        return {
            "group.protocol": "consumer",
            "group.remote.assignor": "range",
            "max.poll.interval.ms": CLASSIC_PROCESSOR_CONSUMER["max.poll.interval.ms"],
        }
    return CLASSIC_PROCESSOR_CONSUMER | group_membership(
        settings.replica_id, static=settings.static_membership
    )


def tune_group(settings: Settings) -> list[str]:
    """Ask the broker for the group's short session and heartbeat (``consumer`` protocol);
    returns what it refused, each with the broker's reason. One request per setting, so a
    floor that refuses one keeps the other."""
    admin = AdminClient(admin_config(settings.bootstrap_servers) | settings.extra_kafka)
    refused = []
    for key, value in GROUP_TIMING.items():
        resource = ConfigResource(
            ResourceType.GROUP,
            settings.processor_group,
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
            ],
        )
        (future,) = admin.incremental_alter_configs([resource], request_timeout=_TIMEOUT_S).values()
        try:
            future.result(timeout=_TIMEOUT_S)
        except KafkaException as exc:
            refused.append(f"{key}={value} ({exc.args[0] if exc.args else exc})")
    return refused


def announce(settings: Settings) -> None:
    """Tune the group and say in the log what a replica can expect of it."""
    refused = tune_group(settings)
    if refused:
        log.warning(
            "group %s (group_protocol=consumer): the broker refused %s; partitions move as "
            "slowly as the broker's defaults allow (heartbeats every 5 s, sessions of 45 s): "
            "lower group.consumer.min.heartbeat.interval.ms and "
            "group.consumer.min.session.timeout.ms on the brokers to fail over faster",
            settings.processor_group,
            "; ".join(refused),
        )
    log.info(
        "group %s uses the consumer group protocol (KIP-848): rebalances move only the "
        "partitions that change owner; no static membership and no liveness eviction",
        settings.processor_group,
    )
