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
