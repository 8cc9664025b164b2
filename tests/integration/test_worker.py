"""The activity worker against a real broker: tasks in, exactly one committed result out."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from engine.adapters.kafka.config import consumer_config, producer_config
from engine.adapters.kafka.worker import KafkaWorker
from engine.codec import decode_message, encode_message
from engine.config.settings import Settings
from engine.config.topics import TopicNames, topic_names
from engine.core.activity_info import current_activity
from engine.core.errors import ApplicationError
from engine.core.keys import partition_for_instance
from engine.core.messages import ActivityResult, ActivityTask, DeadLetter
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import Registry

pytestmark = pytest.mark.kafka

PARTITIONS = 3
TIMEOUT = 30.0


@pytest.fixture
def namespace(admin: AdminClient) -> Iterator[str]:
    """A fresh namespace with the topics a worker uses."""
    ns = f"wtest-{uuid.uuid4().hex[:10]}"
    topics = topic_names(ns)
    wanted = [topics.activity_tasks, topics.activity_results, topics.dead_letters]
    new = [NewTopic(name, num_partitions=PARTITIONS, replication_factor=1) for name in wanted]
    for future in admin.create_topics(new, operation_timeout=TIMEOUT).values():
        future.result(TIMEOUT)
    yield ns
    for future in admin.delete_topics(wanted, operation_timeout=TIMEOUT).values():
        with suppress(Exception):
            future.result(TIMEOUT)


def _settings(bootstrap: str, namespace: str, **kw: Any) -> Settings:
    return Settings(bootstrap_servers=bootstrap, namespace=namespace, **kw)


@contextmanager
def running(worker: KafkaWorker) -> Iterator[KafkaWorker]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-worker")
    thread.start()
    try:
        yield worker
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not stop"
        assert not errors, errors


def _task(instance: str, name: str, value: Any = None, task_id: int = 0) -> ActivityTask:
    return ActivityTask(instance, 0, task_id, 1, name, to_payload(value))


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer(producer_config(bootstrap))
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(TIMEOUT) == 0


def _produce_tasks(bootstrap: str, topics: TopicNames, tasks: list[ActivityTask]) -> None:
    _produce(
        bootstrap,
        topics.activity_tasks,
        [(t.instance_id.encode(), encode_message(t)) for t in tasks],
    )


def _read_all(
    bootstrap: str, topic: str, count: int, *, linger: float = 1.0
) -> list[tuple[Any, list[tuple[str, bytes]]]]:
    """Read (read_committed) until ``count`` records arrived, then ``linger`` more seconds to
    catch duplicates; returns decoded values with headers."""
    consumer = Consumer(consumer_config(bootstrap, f"reader-{uuid.uuid4().hex}"))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    out: list[tuple[Any, list[tuple[str, bytes]]]] = []
    deadline = time.monotonic() + TIMEOUT
    extra_until: float | None = None
    try:
        while time.monotonic() < (extra_until or deadline):
            for message in consumer.consume(100, 0.1):
                if message.error() is None:
                    value = message.value()
                    assert value is not None
                    raw = message.headers() or []
                    pairs = raw.items() if isinstance(raw, dict) else raw
                    headers = [(k, v) for k, v in pairs if isinstance(v, bytes)]
                    out.append((decode_message(value), headers))
            if len(out) >= count and extra_until is None:
                extra_until = time.monotonic() + linger
    finally:
        consumer.close()
    return out


def _results(bootstrap: str, topics: TopicNames, count: int) -> dict[tuple[str, int], Any]:
    records = _read_all(bootstrap, topics.activity_results, count)
    results = [value for value, _ in records]
    assert all(isinstance(r, ActivityResult) for r in results)
    keyed = {(r.instance_id, r.task_id): r for r in results}
    assert len(results) == count, f"expected exactly {count} results, got {len(results)}"
    assert len(keyed) == count, "a task got more than one result"
    return keyed


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        wanted = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in consumer.committed(wanted, timeout=TIMEOUT)}
    finally:
        consumer.close()


def _registry() -> Registry:
    reg = Registry()

    @reg.activity(name="inc")
    def inc(x: int) -> int:
        return x + 1

    @reg.activity(name="ainc")
    async def ainc(x: int) -> int:
        await asyncio.sleep(0.01)
        return x + 1

    @reg.activity(name="key")
    def key(x: Any) -> str:
        return current_activity().idempotency_key

    @reg.activity(name="fail")
    def fail(x: Any) -> None:
        raise ApplicationError("no such customer", type="NotFound", non_retryable=True)

    @reg.activity(name="crash")
    def crash(x: Any) -> None:
        raise RuntimeError("temporary")

    return reg


def test_sync_and_async_activities_give_exactly_one_committed_result_each(
    kafka_bootstrap: str, namespace: str
) -> None:
    topics = topic_names(namespace)
    tasks = [_task(f"wf-{i}", "inc" if i % 2 else "ainc", i, task_id=i) for i in range(40)]
    tasks.append(_task("wf-key", "key", None, task_id=7))
    _produce_tasks(kafka_bootstrap, topics, tasks)
    settings = _settings(kafka_bootstrap, namespace)
    with running(KafkaWorker(settings, _registry(), concurrency=8)) as worker:
        results = _results(kafka_bootstrap, topics, len(tasks))
    for i in range(40):
        result = results[(f"wf-{i}", i)]
        assert result.failure is None and from_payload(result.output) == i + 1
    assert from_payload(results[("wf-key", 7)].output) == "wf-key/0/7"
    assert worker.commits < len(tasks), "offset commits are batched"
    committed = _committed(kafka_bootstrap, settings.worker_group, topics.activity_tasks)
    per_partition: dict[int, int] = {}
    for t in tasks:
        p = partition_for_instance(t.instance_id, PARTITIONS)
        per_partition[p] = per_partition.get(p, 0) + 1
    assert {p: committed[p] for p in per_partition} == per_partition


def test_failures_carry_their_details(kafka_bootstrap: str, namespace: str) -> None:
    topics = topic_names(namespace)
    tasks = [_task("a", "fail"), _task("b", "crash")]
    _produce_tasks(kafka_bootstrap, topics, tasks)
    with running(KafkaWorker(_settings(kafka_bootstrap, namespace), _registry())):
        results = _results(kafka_bootstrap, topics, 2)
    fail, crash = (results[(i, 0)].failure for i in ("a", "b"))
    assert fail is not None and (fail.type, fail.retryable) == ("NotFound", False)
    assert crash is not None and (crash.type, crash.message, crash.retryable) == (
        "RuntimeError",
        "temporary",
        True,
    )
    assert "raise RuntimeError" in crash.stack


def test_a_bad_record_goes_to_dead_letters_and_the_partition_goes_on(
    kafka_bootstrap: str, namespace: str
) -> None:
    topics = topic_names(namespace)
    good = _task("same-key", "inc", 1)
    _produce(
        kafka_bootstrap,
        topics.activity_tasks,
        [(b"same-key", b"\xc3\x01not-a-fingerprint"), (b"same-key", encode_message(good))],
    )
    with running(KafkaWorker(_settings(kafka_bootstrap, namespace), _registry())):
        results = _results(kafka_bootstrap, topics, 1)
        letters = _read_all(kafka_bootstrap, topics.dead_letters, 1, linger=0.2)
    assert from_payload(results[("same-key", 0)].output) == 2
    [(letter, headers)] = letters
    assert isinstance(letter, DeadLetter)
    assert letter.source_topic == topics.activity_tasks and letter.source_offset == 0
    assert letter.value == b"\xc3\x01not-a-fingerprint" and letter.instance_id == "same-key"
    names = dict(headers)
    assert names["source-topic"] == topics.activity_tasks.encode()
    assert names["source-offset"] == b"0" and b"undecodable" in names["reason"]


def test_saturation_pauses_without_a_rebalance_and_resumes(
    kafka_bootstrap: str, namespace: str
) -> None:
    """An activity longer than max.poll.interval.ms runs once: polling goes on while paused."""
    topics = topic_names(namespace)
    registry = Registry()
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "long_runs": 0}

    def enter() -> None:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])

    def leave() -> None:
        with lock:
            state["now"] -= 1

    @registry.activity(name="long")
    def long(x: Any) -> str:
        enter()
        with lock:
            state["long_runs"] += 1
        time.sleep(7.5)
        leave()
        return "long"

    @registry.activity(name="short")
    def short(x: int) -> int:
        enter()
        time.sleep(0.05)
        leave()
        return x

    tasks = [_task("slow", "long")] + [_task(f"s{i}", "short", i, i) for i in range(6)]
    _produce_tasks(kafka_bootstrap, topics, tasks)
    poll_limit = {"max.poll.interval.ms": 6000, "session.timeout.ms": 6000}
    worker = KafkaWorker(
        _settings(kafka_bootstrap, namespace),
        registry,
        concurrency=2,
        prefetch=0,
        consumer_overrides=poll_limit,
    )
    with running(worker):
        results = _results(kafka_bootstrap, topics, len(tasks))
    assert state["max"] <= 2
    assert state["long_runs"] == 1, "no rebalance: the long activity ran once"
    assert from_payload(results[("slow", 0)].output) == "long"
    assert worker.pauses >= 1


ACTIVITY_MODULE = """
import pathlib, time
from engine.runtime.registry import activity

MARKER = pathlib.Path(__file__).with_suffix(".started")

@activity(name="slow_inc")
def slow_inc(x):
    MARKER.write_text("started")
    time.sleep(1.5)
    return x + 1
"""

RUN_CLI = """
import argparse, sys
from engine.cli import worker_cmd
parser = argparse.ArgumentParser()
worker_cmd.register(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
sys.exit(args.handler(args))
"""


def test_run_worker_finishes_running_activities_on_sigterm(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "user_acts.py").write_text(ACTIVITY_MODULE)
    topics = topic_names(namespace)
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN_CLI,
            "run",
            "worker",
            "--module",
            "user_acts",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--namespace",
            namespace,
            "--worker-id",
            "cli-worker",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _produce_tasks(kafka_bootstrap, topics, [_task("cli", "slow_inc", 41)])
        marker = tmp_path / "user_acts.started"
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():
            assert process.poll() is None, process.communicate()[0].decode()
            assert time.monotonic() < deadline, "the activity never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=TIMEOUT)[0].decode()
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    results = _results(kafka_bootstrap, topics, 1)
    assert from_payload(results[("cli", 0)].output) == 42
    committed = _committed(
        kafka_bootstrap, Settings(namespace=namespace).worker_group, topics.activity_tasks
    )
    assert sum(o for o in committed.values() if o > 0) == 1, "its offset was committed"
