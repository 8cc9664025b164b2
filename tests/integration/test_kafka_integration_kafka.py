"""Kafka integration on the real broker: ``ctx.publish`` is seen exactly once by a
read_committed consumer, triggers start workflows and raise events from business topics
(JSON and Avro values), with unusable records in dead letters, and ``topics apply`` creates
the publish and trigger topics a spec declares."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from engine_harness import (
    DEFAULT_MODULES,
    ThreadProcess,
    delete_topics,
    read_topic,
    running_engine,
    unique_namespace,
    wait_until,
)

from engine import Registry
from engine.adapters.kafka.admin import admin_for, describe
from engine.adapters.kafka.config import producer_config
from engine.adapters.kafka.triggers import TriggerBridge
from engine.cli.integration import check_integration_topics
from engine.codec import decode_message, encode_user_avro
from engine.config.settings import load_settings
from engine.config.topics import default_spec_path
from engine.config.triggers import Trigger, parse_triggers
from engine.core.errors import ConfigurationError
from engine.core.history import RecordPublished, RuntimeStatus
from engine.core.messages import DeadLetter
from engine.core.payloads import from_payload

pytestmark = pytest.mark.kafka

MODULES = (*DEFAULT_MODULES, "tests.publish_workflows")
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "out", "type": "string"},
        {"name": "total", "type": "long"},
    ],
}


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, Any]]) -> None:
    """Business records from an ordinary (non-engine) producer; dict values as JSON."""
    producer = Producer(producer_config(bootstrap))
    for key, value in records:
        data = json.dumps(value).encode() if isinstance(value, dict) else value
        producer.produce(topic, key=key, value=data)
    assert producer.flush(30) == 0


def test_published_records_are_seen_once_with_the_state_change(
    kafka_bootstrap: str, make_topic: Any
) -> None:
    out = make_topic(partitions=3, prefix="orders")
    with running_engine(
        kafka_bootstrap,
        partitions=2,
        modules=MODULES,
        settings_changes={"publish_topics": (out,)},
    ) as engine:
        runs = [
            engine.client.start("pub.order", {"out": out, "total": i}, instance_id=f"o-{i}")
            for i in range(8)
        ]
        for run in runs:
            assert engine.wait_for_completion(run, 120).status is RuntimeStatus.COMPLETED
        published = read_topic(kafka_bootstrap, out)
        assert sorted(r.key or b"" for r in published) == sorted(r.encode() for r in runs)
        for record in published:
            body = json.loads(record.value or b"")
            assert body["order"] == (record.key or b"").decode()
            assert record.headers == {"source": b"pub.order"}
        for run in runs:
            journaled = [e.body for e in engine.history(run) if isinstance(e.body, RecordPublished)]
            assert [b.topic for b in journaled] == [out]


def test_triggers_start_workflows_raise_events_and_dead_letter_the_rest(
    kafka_bootstrap: str, make_topic: Any
) -> None:
    orders = make_topic(partitions=3, prefix="biz-orders")
    payments = make_topic(partitions=2, prefix="biz-payments")
    out = make_topic(partitions=1, prefix="out")
    avro_orders = make_topic(partitions=1, prefix="biz-avro")
    [avro] = parse_triggers(
        [
            {
                "topic": avro_orders,
                "workflow": "pub.order",
                "format": "avro",
                "schema": json.dumps(ORDER),
                "id": "field:id",
            }
        ]
    )
    triggers = (
        avro,
        Trigger(topic=orders, workflow="pub.order"),
        Trigger(
            topic=payments, workflow="pub.waiter", action="raise", event="paid", id="field:order.id"
        ),
    )
    with running_engine(
        kafka_bootstrap,
        partitions=2,
        modules=MODULES,
        settings_changes={"publish_topics": (out,), "triggers": triggers},
    ) as engine:
        waiter = engine.client.start("pub.waiter", None, instance_id="w-1")
        bridge = TriggerBridge(engine.settings)
        handle = ThreadProcess("triggers", bridge.run).start()
        try:
            produce(
                kafka_bootstrap,
                orders,
                [(f"biz-{i}".encode(), {"out": out, "total": i}) for i in range(5)]
                + [(None, {"out": out}), (b"biz-x", b"not json")],
            )
            produce(kafka_bootstrap, payments, [(b"any", {"order": {"id": "w-1"}, "eur": 9})])
            produce(kafka_bootstrap, payments, [(b"any", {"order": {}})])
            value = {"id": "avro-1", "out": out, "total": 7}
            produce(kafka_bootstrap, avro_orders, [(None, encode_user_avro(avro.schema, value))])
            assert engine.wait_for_completion("avro-1", 120).status is RuntimeStatus.COMPLETED
            for i in range(5):
                state = engine.wait_for_completion(f"biz-{i}", 120)
                assert state.status is RuntimeStatus.COMPLETED
            state = engine.wait_for_completion(waiter, 120)
            assert state.output == {"order": {"id": "w-1"}, "eur": 9}
            wait_until(lambda: bridge.dead_letters == 3, 60, what="three dead letters")
        finally:
            handle.stop()
        assert handle.error is None, handle.error
        letters = [decode_message(r.value or b"") for r in engine.dead_letters()]
        assert all(isinstance(d, DeadLetter) for d in letters)
        reasons = sorted(d.reason for d in letters if isinstance(d, DeadLetter))
        assert any("has no key" in r for r in reasons), reasons
        assert any("not JSON" in r for r in reasons), reasons
        assert any("no field 'order.id'" in r for r in reasons), reasons
        started = [
            e for e in engine.history("biz-0") if type(e.body).__name__ == "ExecutionStarted"
        ]
        assert len(started) == 1
        assert from_payload(started[0].body.input) == {"out": out, "total": 0}  # type: ignore[attr-defined]
        assert len(read_topic(kafka_bootstrap, out)) == 6


def test_a_trigger_record_the_broker_refuses_goes_to_dead_letters_alone(
    kafka_bootstrap: str, make_topic: Any
) -> None:
    """The commands topic takes less than the engine's limits (a misconfigured cluster), so
    the broker refuses one record's command and the whole transaction with it, on every
    try. The bridge finds that record, writes its dead letter after three refusals in a
    row, and the records beside it still start their workflows."""
    from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

    from engine.adapters.kafka.admin import admin_for
    from engine.services.triggers import REFUSALS_BEFORE_DEAD_LETTER

    orders = make_topic(partitions=1, prefix="biz-big")
    out = make_topic(partitions=1, prefix="out")
    triggers = (Trigger(topic=orders, workflow="pub.order"),)
    with running_engine(
        kafka_bootstrap,
        partitions=2,
        modules=MODULES,
        settings_changes={"publish_topics": (out,), "triggers": triggers},
    ) as engine:
        admin = admin_for(engine.settings)
        entry = ConfigEntry(
            "max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET
        )
        resource = ConfigResource("topic", engine.topics.commands, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)
        bridge = TriggerBridge(engine.settings)
        handle = ThreadProcess("triggers", bridge.run).start()
        try:
            produce(
                kafka_bootstrap,
                orders,
                [
                    (b"small-1", {"out": out, "total": 1}),
                    (b"big", {"out": out, "total": 2, "pad": "x" * 30_000}),
                    (b"small-2", {"out": out, "total": 3}),
                ],
            )
            for instance in ("small-1", "small-2"):
                state = engine.wait_for_completion(instance, 120)
                assert state.status is RuntimeStatus.COMPLETED
            wait_until(lambda: bridge.dead_letters == 1, 120, what="the refused record's letter")
        finally:
            handle.stop()
        assert handle.error is None, handle.error
        (letter,) = [decode_message(r.value or b"") for r in engine.dead_letters()]
        assert isinstance(letter, DeadLetter)
        assert (letter.source_topic, letter.source_offset) == (orders, 1)
        assert f"{REFUSALS_BEFORE_DEAD_LETTER} times in a row" in letter.reason, letter.reason
        assert "refused" in letter.reason, letter.reason
        assert json.loads(letter.value or b"")["total"] == 2  # the record is kept whole
        assert bridge.refusals >= REFUSALS_BEFORE_DEAD_LETTER
        assert engine.client.get("big") is None
        assert len(read_topic(kafka_bootstrap, out)) == 2


def test_user_topics_of_a_spec_are_created_by_topics_apply_and_used_by_run_processor(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The publish and trigger topics a spec declares under [user-topics]: ``topics check``
    reports them missing, ``topics apply`` creates them as declared, and a ``run processor``
    that refused to start without them starts, takes a trigger's record and publishes."""
    namespace = unique_namespace("usertopics")
    orders, out = f"{namespace}-orders", f"{namespace}-shipments"
    spec = tmp_path / "topics.toml"
    spec.write_text(
        default_spec_path().read_text(encoding="utf-8")
        + f'\n[user-topics."{orders}"]\npartitions = 3\n'
        + f'\n[user-topics."{out}"]\npartitions = 1\nconfig = {{ "retention.ms" = "3600000" }}\n',
        encoding="utf-8",
    )
    flags = ["--bootstrap-servers", kafka_bootstrap, "--namespace", namespace]
    flags += ["--partitions", "2", "--spec", str(spec)]
    settings = load_settings(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, env={}, publish_topics=(out,)
    )
    try:
        code, report = _topics_cli("check", *flags)
        missing = {d["topic"] for d in report["drift"] if d["kind"] == "missing"}
        assert code == 1 and {orders, out} <= missing
        with pytest.raises(ConfigurationError, match="topics apply --spec"):
            check_integration_topics(settings, Registry())

        code, report = _topics_cli("apply", *flags)
        assert code == 0 and report["clean"], report
        assert {orders, out} <= set(report["created"])
        admin = admin_for(settings)
        described = describe(admin, [orders, out])
        assert (described[orders].partitions, described[out].partitions) == (3, 1)
        assert described[out].config["retention.ms"] == "3600000"
        assert _topics_cli("check", *flags)[0] == 0

        with running_engine(
            kafka_bootstrap,
            namespace=namespace,
            partitions=2,
            workers=0,
            in_process=False,
            modules=MODULES,
            processor_args=("--trigger", f"{orders}:pub.order", "--publish-topic", out),
        ) as engine:
            produce(kafka_bootstrap, orders, [(b"u-1", {"out": out, "total": 5})])
            state = engine.wait_for_completion("u-1", 120)
            assert state.status is RuntimeStatus.COMPLETED, engine.logs()
            [published] = read_topic(kafka_bootstrap, out)
            assert published.key == b"u-1" and json.loads(published.value or b"")["total"] == 5
    finally:
        delete_topics(settings)  # the engine's, when the test stopped before running_engine
        futures = admin_for(settings).delete_topics([orders, out], operation_timeout=30)
        for future in futures.values():
            with contextlib.suppress(Exception):
                future.result(30)


def _topics_cli(*argv: str) -> tuple[int, dict[str, Any]]:
    """``turnstile topics ... --json`` in this process: its exit code and report."""
    from engine.cli import topics

    parser = argparse.ArgumentParser(prog="turnstile")
    topics.register(parser.add_subparsers())
    args = parser.parse_args(["topics", *argv, "--json"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code: int = args.handler(args)
    return code, json.loads(out.getvalue())
