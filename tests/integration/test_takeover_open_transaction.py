"""Takeover while a dead replica's transaction is still open on a changelog partition.

A zombie's open transaction holds the changelog's last stable offset (LSO) back; records that
a later owner committed after it lie beyond the LSO. A replica that restores "to partition
EOF" would stop at the LSO, build stale tables and fork the history on top of them. Here a raw
transactional producer plays the zombie, the running replica commits more turns after it, and
a fresh replica takes over: it must not process before the open transaction ends, and its
tables must then equal what ``audit state`` derives from the history topic.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from engine_harness import EngineProcess, history_problems, running_engine, wait_until

from engine.adapters.kafka_config import consumer_config, producer_config
from engine.adapters.kafka_io import log_end_offsets
from engine.cli.main import main
from engine.core.history import EventRaised, RuntimeStatus
from engine.services.processor import keys

pytestmark = pytest.mark.kafka

PARTITIONS = 2
EARLY = 8
LATE = 8


def _zombie(bootstrap: str, topic: str) -> Producer:
    """A transactional producer that leaves a transaction open on every changelog partition."""
    config = producer_config(bootstrap, client_id="zombie")
    config.update(
        {"transactional.id": f"zombie-{uuid.uuid4().hex}", "transaction.timeout.ms": 300_000}
    )
    zombie = Producer(config)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for p in range(PARTITIONS):
        zombie.produce(topic, key=keys.meta_key("never-committed"), value=b"stale", partition=p)
    assert zombie.flush(30) == 0
    return zombie


def _stable_and_end(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """Per partition: (last stable offset, log end offset)."""
    config = consumer_config(bootstrap, f"lso-{uuid.uuid4().hex}")
    wanted = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    ends = log_end_offsets(config, wanted)
    committed = Consumer(config)
    try:
        stable = [committed.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in wanted]
    finally:
        committed.close()
    return [(stable[p], ends[(topic, p)][1]) for p in range(PARTITIONS)]


def _running(engine: object, instance: str) -> bool:
    state = engine.client.get(instance)  # type: ignore[attr-defined]
    return state is not None and state.status is RuntimeStatus.RUNNING


def test_a_replica_does_not_restore_short_of_an_open_transaction(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, in_process=False, state_dir=tmp_path
    ) as engine:
        client, changelog = engine.client, engine.topics.state_changelog
        old = engine.processors["processor-0"]
        assert isinstance(old, EngineProcess)
        old.wait_for_log(" restored: ")
        early = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(EARLY)]
        client.flush()
        for instance in early:
            wait_until(lambda i=instance: _running(engine, i), 60, what=f"{instance} to run")

        zombie = _zombie(engine.bootstrap, changelog)
        # the live replica goes on committing turns after the zombie's open records
        for i, instance in enumerate(early[: EARLY // 2]):
            client.raise_event(instance, "go", i)
        late = [client.start("t.wait_event", {"n": 100 + i}, flush=False) for i in range(LATE)]
        client.flush()
        for instance in early[: EARLY // 2]:
            assert engine.wait_for_completion(instance, 60).status is RuntimeStatus.COMPLETED
        for instance in late:
            wait_until(lambda i=instance: _running(engine, i), 60, what=f"{instance} to run")
        bounds = _stable_and_end(engine.bootstrap, changelog)
        assert all(stable < end for stable, end in bounds), bounds
        old.kill()

        new = engine.start_processor("processor-1")
        assert isinstance(new, EngineProcess)
        new.wait_for_log("waits for an open transaction")
        waiting = [*early[EARLY // 2 :], *late]
        for i, instance in enumerate(waiting):
            client.raise_event(instance, "go", 1000 + i)
        time.sleep(3.0)  # while the zombie's transaction is open, nothing may be processed
        assert " restored: " not in new.current_log(), new.current_log()[-3000:]
        assert all(_running(engine, i) for i in waiting)
        zombie.abort_transaction(30)

        new.wait_for_log(" restored: ")
        for i, instance in enumerate(waiting):
            state = engine.wait_for_completion(instance, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output["got"] == 1000 + i
        records = engine.history_records()
        problems = [
            p for instance in [*early, *late] for p in history_problems(instance, records[instance])
        ]
        assert not problems, "\n".join(problems[:20])
        for instance in [*early, *late]:
            raised = [e for _, e in records[instance] if isinstance(e.body, EventRaised)]
            assert len(raised) == 1, f"{instance}: the event was applied {len(raised)} times"
        assert new.stop() == 0

        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0
        replica = ["--state-dir", str(tmp_path / "processor-1"), "--replica-id", "processor-1"]
        assert main(["audit", "state", *replica, *cli]) == 0
