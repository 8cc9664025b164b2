"""The client against a real broker: commands on the right partition, reads from status."""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from engine.adapters.kafka.config import (
    consumer_config,
    transactional_producer_config,
)
from engine.cli import client_cmds
from engine.client import Client
from engine.codec import decode_message, encode_message
from engine.config.settings import Settings
from engine.config.topics import TopicNames, topic_names
from engine.core.errors import BrokerError, WaitTimeoutError
from engine.core.history import RuntimeStatus
from engine.core.keys import murmur2_partition
from engine.core.messages import IdReusePolicy, InstanceStatus, RaiseEvent, StartWorkflow
from engine.core.payloads import Payload, from_payload, to_payload

pytestmark = pytest.mark.kafka

PARTITIONS = 4
TIMEOUT = 30.0


@pytest.fixture
def namespace(admin: AdminClient) -> Iterator[str]:
    """A fresh namespace with a commands topic and a compacted status topic."""
    ns = f"ctest-{uuid.uuid4().hex[:10]}"
    topics = topic_names(ns)
    new = [
        NewTopic(topics.commands, num_partitions=PARTITIONS, replication_factor=1),
        NewTopic(
            topics.status,
            num_partitions=PARTITIONS,
            replication_factor=1,
            config={"cleanup.policy": "compact"},
        ),
    ]
    for future in admin.create_topics(new, operation_timeout=TIMEOUT).values():
        future.result(TIMEOUT)
    _await_topics(admin, [topics.commands, topics.status])
    yield ns
    deleted = admin.delete_topics([topics.commands, topics.status], operation_timeout=TIMEOUT)
    for future in deleted.values():
        with suppress(Exception):
            future.result(TIMEOUT)


def _await_topics(admin: AdminClient, names: list[str]) -> None:
    """CreateTopics returns once the controller has them; the broker answering metadata
    learns of them a moment later (longer on a busy machine) - and the client asks it."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        known = admin.list_topics(timeout=TIMEOUT).topics
        if all(n in known and len(known[n].partitions) == PARTITIONS for n in names):
            return
        time.sleep(0.05)
    pytest.fail(f"topics {names} did not show {PARTITIONS} partitions within {TIMEOUT}s")


def _settings(bootstrap: str, namespace: str) -> Settings:
    return Settings(bootstrap_servers=bootstrap, namespace=namespace)


def _status(instance_id: str, status: RuntimeStatus, output: Any = None) -> InstanceStatus:
    now = int(time.time() * 1000)
    return InstanceStatus(
        instance_id,
        name="orders",
        status=status,
        created_ms=now,
        last_updated_ms=now,
        output=None if output is None else to_payload(output),
    )


def _publish(
    bootstrap: str, topics: TopicNames, records: Sequence[tuple[str, InstanceStatus | None]]
) -> None:
    """Write status records the way the processor does: in a transaction, murmur2-keyed."""
    txn_id = f"test-status-{uuid.uuid4().hex}"
    producer = Producer(transactional_producer_config(bootstrap, txn_id))
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    for instance_id, status in records:
        value = None if status is None else encode_message(status)
        producer.produce(topics.status, value, instance_id.encode())
    producer.commit_transaction(TIMEOUT)


def _commands(bootstrap: str, topics: TopicNames, count: int) -> list[tuple[int, bytes, Any]]:
    consumer = Consumer(consumer_config(bootstrap, f"reader-{uuid.uuid4().hex}"))
    consumer.assign(
        [TopicPartition(topics.commands, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
    )
    out: list[tuple[int, bytes, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.1):
                if m.error() is None:
                    key, value = m.key(), m.value()
                    assert key is not None and value is not None
                    out.append((m.partition() or 0, key, decode_message(value)))
    finally:
        consumer.close()
    assert len(out) == count
    return out


def test_start_writes_a_decodable_command_to_the_murmur2_partition(
    kafka_bootstrap: str, namespace: str
) -> None:
    topics = topic_names(namespace)
    with Client(kafka_bootstrap, namespace, read_status=False) as client:
        given = client.start(
            "orders",
            {"order": 42},
            instance_id="order-42",
            reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING,
            tags={"team": "checkout"},
            wait=False,  # no processor here: nothing would answer
        )
        generated = client.start("orders", wait=False)
        client.raise_event("order-42", "paid", {"amount": 3}, wait=False)
    assert given == "order-42" and len(generated) == 32
    records = _commands(kafka_bootstrap, topics, 3)
    by_key: dict[bytes, list[Any]] = {}
    for partition, key, command in records:
        assert partition == murmur2_partition(key, PARTITIONS)
        by_key.setdefault(key, []).append(command)
    start, event = by_key[b"order-42"]
    assert isinstance(start, StartWorkflow) and start.name == "orders"
    assert from_payload(start.input) == {"order": 42}
    assert start.reuse_policy is IdReusePolicy.TERMINATE_IF_RUNNING
    assert start.tags == {"team": "checkout"}
    assert isinstance(event, RaiseEvent) and from_payload(event.input) == {"amount": 3}
    assert isinstance(by_key[generated.encode()][0], StartWorkflow)


def test_start_many_writes_every_command(kafka_bootstrap: str, namespace: str) -> None:
    with Client.from_settings(_settings(kafka_bootstrap, namespace), read_status=False) as c:
        ids = c.start_many("orders", range(200))
    records = _commands(kafka_bootstrap, topic_names(namespace), 200)
    assert {key.decode() for _, key, _ in records} == set(ids)


def test_get_reads_the_status_topic_after_catching_up(kafka_bootstrap: str, namespace: str) -> None:
    topics = topic_names(namespace)
    _publish(
        kafka_bootstrap,
        topics,
        [
            ("done", _status("done", RuntimeStatus.RUNNING)),
            ("done", _status("done", RuntimeStatus.COMPLETED, {"total": 7})),
            ("purged", _status("purged", RuntimeStatus.COMPLETED)),
            ("purged", None),
        ],
    )
    with Client(kafka_bootstrap, namespace) as client:
        state = client.get("done")
        assert state is not None and state.status is RuntimeStatus.COMPLETED
        assert state.output == {"total": 7}
        assert client.get("purged") is None
        assert client.get("unknown") is None
        assert [s.instance_id for s in client.list_instances()] == ["done"]


def test_get_on_an_empty_status_topic_returns_none(kafka_bootstrap: str, namespace: str) -> None:
    with Client(kafka_bootstrap, namespace, timeout=10) as client:
        started = time.monotonic()
        assert client.get("nothing") is None
        assert time.monotonic() - started < 10


def test_waits_resolve_when_the_status_arrives(kafka_bootstrap: str, namespace: str) -> None:
    topics = topic_names(namespace)
    with Client(kafka_bootstrap, namespace) as client:
        assert client.get("w") is None
        futures = [client.completion_future(f"many-{i}") for i in range(50)]
        done: list[Any] = []
        waiter = threading.Thread(target=lambda: done.append(client.wait_for_completion("w", 20)))
        waiter.start()
        _publish(kafka_bootstrap, topics, [("w", _status("w", RuntimeStatus.RUNNING))])
        assert client.wait_for_start("w", 20).status is RuntimeStatus.RUNNING
        assert not done
        _publish(
            kafka_bootstrap,
            topics,
            [("w", _status("w", RuntimeStatus.FAILED))]
            + [(f"many-{i}", _status(f"many-{i}", RuntimeStatus.COMPLETED, i)) for i in range(50)],
        )
        waiter.join(20)
        assert done and done[0].status is RuntimeStatus.FAILED
        outputs = [from_payload(f.result(20).output) for f in futures]
        assert outputs == list(range(50))


def test_wait_times_out(kafka_bootstrap: str, namespace: str) -> None:
    with Client(kafka_bootstrap, namespace) as client:
        started = time.monotonic()
        with pytest.raises(WaitTimeoutError, match=r"did not complete within 0\.5s"):
            client.wait_for_completion("never", timeout=0.5)
        assert time.monotonic() - started < 5


def test_a_missing_namespace_says_how_to_create_its_topics(kafka_bootstrap: str) -> None:
    with pytest.raises(BrokerError, match="turnstile topics apply --namespace nowhere-"):
        Client(kafka_bootstrap, f"nowhere-{uuid.uuid4().hex[:6]}")


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    client_cmds.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    result: int = args.handler(args)
    return result


def test_cli_start_status_and_wait(
    kafka_bootstrap: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--bootstrap-servers", kafka_bootstrap, "--namespace", namespace)
    start = ("start", "orders", "--input", '{"n": 1}', "--id", "cli-1", "--no-wait")
    assert _cli(*start, *flags) == 0
    assert capsys.readouterr().out.strip() == "cli-1"
    [(_, _, command)] = _commands(kafka_bootstrap, topic_names(namespace), 1)
    assert isinstance(command, StartWorkflow) and from_payload(command.input) == {"n": 1}

    _publish(
        kafka_bootstrap,
        topic_names(namespace),
        [("cli-1", _status("cli-1", RuntimeStatus.COMPLETED, [1, 2]))],
    )
    assert _cli("status", "cli-1", "--json", *flags) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "COMPLETED" and shown["output"] == [1, 2]
    assert _cli("wait", "cli-1", "--timeout", "10", *flags) == 0
    assert "COMPLETED" in capsys.readouterr().out
    assert _cli("wait", "cli-2", "--timeout", "0.3", *flags) == client_cmds.EXIT_TIMEOUT


def test_cli_list_filters_by_status_and_name(
    kafka_bootstrap: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--bootstrap-servers", kafka_bootstrap, "--namespace", namespace)
    _publish(
        kafka_bootstrap,
        topic_names(namespace),
        [
            ("l-1", _status("l-1", RuntimeStatus.COMPLETED, 1)),
            ("l-2", _status("l-2", RuntimeStatus.RUNNING, None)),
        ],
    )
    assert _cli("list", "--status", "completed", "--json", *flags) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["instance_id"] for s in listed] == ["l-1"]
    assert _cli("list", *flags) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(line.split()[0] for line in lines) == ["l-1", "l-2"]


def test_cli_shows_an_undecodable_payload_instead_of_failing(
    kafka_bootstrap: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--bootstrap-servers", kafka_bootstrap, "--namespace", namespace)
    bad_json = replace(_status("u-1", RuntimeStatus.FAILED), input=Payload(b'{"cut', "json"))
    unknown = replace(
        _status("u-2", RuntimeStatus.COMPLETED), output=Payload(b"\x01\x02", "x-proto")
    )
    _publish(kafka_bootstrap, topic_names(namespace), [("u-1", bad_json), ("u-2", unknown)])
    assert _cli("status", "u-1", "--json", *flags) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["input"]["encoding"] == "json" and shown["input"]["size"] == 5
    assert "not valid JSON" in shown["input"]["undecodable"]
    assert _cli("status", "u-2", *flags) == 0
    assert "x-proto" in capsys.readouterr().out
    assert _cli("list", "--json", *flags) == 0
    listed = {s["instance_id"]: s for s in json.loads(capsys.readouterr().out)}
    assert listed["u-2"]["output"]["first_bytes"] == "0102"
