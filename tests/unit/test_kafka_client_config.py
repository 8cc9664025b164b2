"""What every producer and consumer group member of the engine asks of the cluster: writes
acknowledged by every in-sync replica, and static group membership under the process's id."""

from __future__ import annotations

from engine.adapters.kafka.config import (
    group_membership,
    producer_config,
    transactional_producer_config,
)


def test_every_producer_waits_for_all_in_sync_replicas() -> None:
    """acks=all with min.insync.replicas 2 on a cluster: a write survives one broker."""
    plain = producer_config("b:1")
    transactional = transactional_producer_config("b:1", "ns.processor.processor-0")
    for config in (plain, transactional):
        assert config["acks"] == "all"
        assert config["enable.idempotence"] is True
    assert transactional["transactional.id"] == "ns.processor.processor-0"


def test_static_membership_joins_under_the_process_id_and_can_be_turned_off() -> None:
    assert group_membership("processor-3") == {"group.instance.id": "processor-3"}
    assert group_membership("processor-3", static=False) == {}


def test_the_consumer_group_protocol_leaves_session_and_static_id_to_the_broker() -> None:
    from engine.adapters.kafka.group_protocol import processor_group_config
    from engine.config.settings import load_settings

    classic = processor_group_config(load_settings(replica_id="processor-2", env={}))
    assert classic["group.instance.id"] == "processor-2"
    assert classic["session.timeout.ms"] == 10_000
    consumer = processor_group_config(
        load_settings(replica_id="processor-2", group_protocol="consumer", env={})
    )
    assert consumer["group.protocol"] == "consumer"
    assert consumer["group.remote.assignor"] == "range"  # co-partitions the input topics
    # librdkafka refuses client-side session settings under this protocol, and the broker
    # refuses a static id still held by a crashed member.
    assert not {"session.timeout.ms", "heartbeat.interval.ms", "group.instance.id"} & set(consumer)


def test_an_unknown_group_protocol_is_refused_with_the_choices() -> None:
    import pytest

    from engine.config.settings import load_settings
    from engine.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="classic, consumer"):
        load_settings(group_protocol="cooperative", env={})
