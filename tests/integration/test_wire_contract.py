"""The wire contract on a real broker: a producer that knows only schemas/Command.avsc
starts a workflow the engine understands, and the topics tooling keeps the cluster as
topics/topics.toml declares it."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from fastavro.schema import fingerprint, to_parsing_canonical_form

pytestmark = pytest.mark.kafka

COMMAND_AVSC = Path(__file__).resolve().parents[2] / "schemas" / "Command.avsc"
#: The topics the spec declares, read as a plain TOML reader would.
SPEC_TOPICS = tomllib.loads(
    (COMMAND_AVSC.parents[1] / "topics" / "topics.toml").read_text(encoding="utf-8")
)["topics"]
TIMEOUT = 30.0


def _foreign_start_command(instance_id: str) -> bytes:
    """What a Java, Go or kcat producer does: Command.avsc, Avro, and the 10-byte header.

    Deliberately free of engine code. Fields with defaults are left out, as a producer
    using generated builders would.
    """
    schema = fastavro.parse_schema(json.loads(COMMAND_AVSC.read_text()))
    canonical = to_parsing_canonical_form(schema)
    header = b"\xc3\x01" + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    start = {
        "name": "checkout",
        "input": {"data": b'{"amount": 42}', "encoding": "json"},
        "reuse_policy": "TERMINATE_IF_RUNNING",
        "request_id": "req-1",
        "tags": {"team": "payments"},
    }
    record = {"instance_id": instance_id, "body": ("io.turnstile.command.StartWorkflow", start)}
    out = io.BytesIO()
    out.write(header)
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def _consume_one(bootstrap: str, topic: str) -> Any:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"wire-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    try:
        for _ in range(int(TIMEOUT)):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(f"nothing arrived on {topic} within {TIMEOUT}s")
    finally:
        consumer.close()


def test_foreign_producer_start_command_decodes(kafka_bootstrap: str, make_topic: Any) -> None:
    from engine.codec import decode_message
    from engine.core.keys import partition_for_instance
    from engine.core.messages import IdReusePolicy, StartWorkflow
    from engine.core.payloads import Payload

    topic = make_topic(partitions=4, prefix="commands")
    instance_id = "order-42"
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    producer.produce(
        topic, key=instance_id.encode("utf-8"), value=_foreign_start_command(instance_id)
    )
    assert producer.flush(TIMEOUT) == 0

    msg = _consume_one(kafka_bootstrap, topic)
    assert msg.partition() == partition_for_instance(instance_id, 4)
    assert decode_message(msg.value()) == StartWorkflow(
        instance_id,
        name="checkout",
        input=Payload(b'{"amount": 42}'),
        reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING,
        request_id="req-1",
        tags={"team": "payments"},
    )


# --- topics apply / check -----------------------------------------------------------------


def _topics_cli(*argv: str) -> tuple[int, dict[str, Any]]:
    from engine.cli import topics

    parser = argparse.ArgumentParser(prog="turnstile")
    topics.register(parser.add_subparsers())
    args = parser.parse_args(["topics", *argv, "--json"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code: int = args.handler(args)
    return code, json.loads(out.getvalue())


@pytest.fixture
def namespace(kafka_bootstrap: str) -> Iterator[str]:
    """A fresh namespace whose topics are deleted afterwards."""
    name = f"wire-{uuid.uuid4().hex[:8]}"
    yield name
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    ours = [t for t in admin.list_topics(timeout=TIMEOUT).topics if t.startswith(name + ".")]
    if ours:
        for future in admin.delete_topics(ours, operation_timeout=TIMEOUT).values():
            with contextlib.suppress(Exception):
                future.result(timeout=TIMEOUT)


def test_topics_apply_then_check_is_clean(kafka_bootstrap: str, namespace: str) -> None:
    flags = [
        "--bootstrap-servers",
        kafka_bootstrap,
        "--namespace",
        namespace,
        "--partitions",
        "3",
        "--replication-factor",
        "1",
    ]
    code, report = _topics_cli("check", *flags)
    assert code == 1 and len([d for d in report["drift"] if d["kind"] == "missing"]) == len(
        SPEC_TOPICS
    )

    code, report = _topics_cli("apply", *flags)
    assert code == 0, report
    assert len(report["created"]) == len(SPEC_TOPICS) and report["clean"]

    code, report = _topics_cli("check", *flags)
    assert (code, report["drift"]) == (0, [])

    code, report = _topics_cli("apply", *flags)  # idempotent
    assert (code, report["created"]) == (0, [])


def test_partition_drift_is_reported_and_refused(kafka_bootstrap: str, namespace: str) -> None:
    flags = ["--bootstrap-servers", kafka_bootstrap, "--namespace", namespace]
    assert _topics_cli("apply", *flags, "--partitions", "2")[0] == 0

    code, report = _topics_cli("check", *flags, "--partitions", "4")
    assert code == 1
    assert {d["kind"] for d in report["drift"]} == {"partitions"}

    code, report = _topics_cli("apply", *flags, "--partitions", "4")
    assert code == 1 and report["refused"] and report["created"] == []
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    history = admin.list_topics(timeout=TIMEOUT).topics[f"{namespace}.history"]
    assert len(history.partitions) == 2  # untouched


def test_config_drift_is_fixed_only_when_asked(kafka_bootstrap: str, namespace: str) -> None:
    flags = ["--bootstrap-servers", kafka_bootstrap, "--namespace", namespace, "--partitions", "1"]
    assert _topics_cli("apply", *flags)[0] == 0
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    entry = ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(
        ResourceType.TOPIC, f"{namespace}.commands", incremental_configs=[entry]
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=TIMEOUT)
    _await_config(admin, f"{namespace}.commands", "retention.ms", "1000")

    code, report = _topics_cli("check", *flags)
    assert code == 1
    assert [(d["kind"], d["key"], d["actual"]) for d in report["drift"]] == [
        ("config", "retention.ms", "1000")
    ]
    assert _topics_cli("apply", *flags)[0] == 1  # reported, not changed
    code, report = _topics_cli("apply", *flags, "--fix-config")
    assert code == 0 and [d["key"] for d in report["altered"]] == ["retention.ms"]
    assert _topics_cli("check", *flags)[0] == 0


def _await_config(admin: AdminClient, topic: str, key: str, value: str) -> None:
    """Wait until the broker describes the topic's config as altered: the controller
    accepts the change before every broker serves it in its answers."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        (future,) = admin.describe_configs([resource]).values()
        if future.result(timeout=TIMEOUT)[key].value == value:
            return
        time.sleep(0.1)
    pytest.fail(f"{topic} did not show {key}={value} within {TIMEOUT}s")


def _max_message_bytes(admin: AdminClient, topics: list[str]) -> set[str]:
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
    values = set()
    for future in admin.describe_configs(resources).values():
        values.add(future.result(timeout=TIMEOUT)["max.message.bytes"].value)
    return values


def test_topics_apply_keeps_max_message_bytes_in_step_with_max_record_bytes(
    kafka_bootstrap: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every topic accepts the largest record the size limits allow (max_record_bytes plus
    the batch framing); a raised max_record_bytes is reported as drift by ``topics check``
    and set on every topic by ``topics apply --fix-config``."""
    from engine.config.settings import load_settings
    from engine.config.topics import topic_max_message_bytes

    flags = ["--bootstrap-servers", kafka_bootstrap, "--namespace", namespace, "--partitions", "1"]
    monkeypatch.delenv("TURNSTILE_MAX_RECORD_BYTES", raising=False)
    assert _topics_cli("apply", *flags)[0] == 0
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [f"{namespace}.{name}" for name in SPEC_TOPICS]
    default = str(topic_max_message_bytes(load_settings(env={})))
    assert _max_message_bytes(admin, names) == {default}

    monkeypatch.setenv("TURNSTILE_MAX_RECORD_BYTES", "2000000")
    raised = str(topic_max_message_bytes(load_settings(env={}, max_record_bytes=2_000_000)))
    code, report = _topics_cli("check", *flags)
    assert code == 1
    drift = {(d["topic"], d["key"], d["expected"], d["actual"]) for d in report["drift"]}
    assert drift == {(name, "max.message.bytes", raised, default) for name in names}
    assert _topics_cli("apply", *flags)[0] == 1  # reported, not changed
    code, report = _topics_cli("apply", *flags, "--fix-config")
    assert code == 0 and {d["key"] for d in report["altered"]} == {"max.message.bytes"}
    assert _max_message_bytes(admin, names) == {raised}
    assert _topics_cli("check", *flags)[0] == 0
