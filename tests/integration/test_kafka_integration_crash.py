"""Exactly once between the engine and the user's topics, through SIGKILLs: a trigger
starts one workflow per business record and each workflow publishes one record, while the
processor replicas (which run the trigger bridge too) are killed and restarted.

Afterwards a read_committed consumer of the user topic sees every published record exactly
once, every business record became exactly one start command and one run, and nothing went
to dead letters. The random moments come from a seed printed at the start
(``CRASH_SEED=<n>`` replays it).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from engine_harness import (
    DEFAULT_MODULES,
    EngineProcess,
    history_problems,
    read_topic,
    running_engine,
)

from engine.adapters.kafka.config import producer_config
from engine.codec import decode_message
from engine.core.history import ExecutionStarted, RecordPublished, RuntimeStatus
from engine.core.messages import StartWorkflow

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RECORDS = 120
KILLS = 4
PRODUCE_SECONDS = 16.0
WAIT = 240.0


def _produce_business_records(bootstrap: str, topic: str, out: str, rng: random.Random) -> None:
    producer = Producer(producer_config(bootstrap))
    batch = 10
    for first in range(0, RECORDS, batch):
        for i in range(first, first + batch):
            value = {"out": out, "total": i, "sleep": round(rng.uniform(0.1, 1.5), 2)}
            producer.produce(topic, key=f"biz-{i}".encode(), value=json.dumps(value).encode())
        producer.flush(30)
        time.sleep(PRODUCE_SECONDS / (RECORDS / batch))
    assert producer.flush(30) == 0


def test_trigger_starts_and_publishes_exactly_once_through_sigkills(
    kafka_bootstrap: str, make_topic: Any, tmp_path: Path
) -> None:
    seed = int(os.environ.get("CRASH_SEED", time.time_ns() % 1_000_000))
    print(f"CRASH_SEED={seed}")
    rng = random.Random(seed)
    business = make_topic(partitions=3, prefix="biz")
    out = make_topic(partitions=2, prefix="published")
    with running_engine(
        kafka_bootstrap,
        partitions=4,
        replicas=2,
        workers=0,
        in_process=False,
        state_dir=tmp_path,
        modules=(*DEFAULT_MODULES, "tests.publish_workflows"),
        processor_args=("--trigger", f"{business}:pub.order", "--publish-topic", out),
    ) as engine:
        replicas = [engine.processors[f"processor-{i}"] for i in range(2)]
        assert all(isinstance(r, EngineProcess) for r in replicas)
        errors: list[BaseException] = []

        def produce() -> None:
            try:
                _produce_business_records(kafka_bootstrap, business, out, random.Random(seed))
            except BaseException as exc:
                errors.append(exc)

        producer = threading.Thread(target=produce, name="business-producer")
        producer.start()
        for k in range(KILLS):
            victim = replicas[k % 2]
            assert isinstance(victim, EngineProcess)
            victim.wait_for_log("restored:", 120)
            time.sleep(rng.uniform(0.5, 3.0))
            assert victim.alive, f"{victim.name} exited by itself:\n{engine.logs()}"
            victim.kill()
            time.sleep(rng.uniform(0.0, 1.0))
            victim.start()
        producer.join()
        assert not errors, errors

        ids = [f"biz-{i}" for i in range(RECORDS)]
        for instance in ids:
            state = engine.wait_for_completion(instance, WAIT)
            assert state.status is RuntimeStatus.COMPLETED, (instance, state.failure)
        assert all(isinstance(r, EngineProcess) and r.alive for r in replicas), engine.logs()

        published = read_topic(kafka_bootstrap, out)
        seen = Counter((r.key or b"").decode() for r in published)
        assert seen == Counter(ids), {k: n for k, n in seen.items() if n != 1}

        starts = [
            m
            for m in (decode_message(r.value or b"") for r in engine.read(engine.topics.commands))
            if isinstance(m, StartWorkflow)
        ]
        assert Counter(m.instance_id for m in starts) == Counter(ids)
        assert len({m.request_id for m in starts}) == RECORDS

        histories = engine.history_records()
        assert set(histories) == set(ids)
        problems: list[str] = []
        for instance in ids:
            records = histories[instance]
            problems += history_problems(instance, records)
            bodies = [e.body for _, e in records]
            assert sum(isinstance(b, ExecutionStarted) for b in bodies) == 1, instance
            assert sum(isinstance(b, RecordPublished) for b in bodies) == 1, instance
        assert not problems, "\n".join(problems[:30])
        assert not engine.dead_letters()
