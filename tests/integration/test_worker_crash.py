"""The worker commits after delivery: SIGKILLed again and again while results are on their
way, it loses nothing and nothing is applied twice.

The worker produces results outside any transaction and commits its task offsets only once
they were delivered, so a kill re-runs the tasks after its last commit and their results can
reach the processor twice. Afterwards every workflow completed once with the right output,
each activity's completion is in its history exactly once, the history chains verify, and
the activity-results topic shows whether copies did arrive (and were dropped).

The random moments come from a seed printed at the start (``CRASH_SEED=<n>`` replays it).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from engine_harness import EngineProcess, history_problems, running_engine

from engine.adapters.kafka.config import consumer_config
from engine.cli.main import main
from engine.core.history import ExecutionCompleted, RuntimeStatus, TaskCompleted
from engine.core.payloads import from_payload

pytestmark = pytest.mark.kafka

WORKFLOWS = 150
KILLS = 4
START_SECONDS = 12.0
WAIT = 240.0


def _result_records(bootstrap: str, topic: str, partitions: int) -> int:
    """How many records the activity-results topic holds (copies included)."""
    consumer = Consumer(consumer_config(bootstrap, f"count-{time.time_ns()}"))
    try:
        total = 0
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        consumer.close()


def test_worker_sigkills_lose_no_result_and_apply_none_twice(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("CRASH_SEED", time.time_ns() % 1_000_000))
    print(f"CRASH_SEED={seed}")
    rng = random.Random(seed)
    with running_engine(
        kafka_bootstrap, partitions=4, in_process=False, state_dir=tmp_path
    ) as engine:
        worker = engine.workers["worker-0"]
        assert isinstance(worker, EngineProcess)
        client = engine.client
        expected: dict[str, int] = {}
        starter_error: list[BaseException] = []

        def start_all() -> None:
            try:
                batch = 10
                pause = START_SECONDS / (WORKFLOWS / batch)
                for first in range(0, WORKFLOWS, batch):
                    for i in range(first, first + batch):
                        expected[client.start("chain3.activities", i, flush=False)] = i + 3
                    client.flush()
                    time.sleep(pause)
            except BaseException as exc:
                starter_error.append(exc)

        starter = threading.Thread(target=start_all, name="starter")
        starter.start()
        for _ in range(KILLS):  # each incarnation is killed once it owns partitions
            worker.wait_for_log("assigned [", 120)
            time.sleep(rng.uniform(0.3, 2.5))
            assert worker.alive, f"the worker exited by itself:\n{engine.logs()}"
            worker.kill()
            time.sleep(rng.uniform(0.0, 0.5))
            worker.start()
        starter.join()
        assert not starter_error, starter_error
        assert len(expected) == WORKFLOWS

        for instance, output in expected.items():
            state = engine.wait_for_completion(instance, WAIT)
            assert state.status is RuntimeStatus.COMPLETED, (instance, state.failure)
            assert state.output == output
        assert worker.alive and worker.starts == KILLS + 1, engine.logs()

        histories = engine.history_records()
        problems: list[str] = []
        for instance, output in expected.items():
            records = histories[instance]
            problems += history_problems(instance, records)
            events = [e.body for _, e in records]
            [end] = [e for e in events if isinstance(e, ExecutionCompleted)]
            assert from_payload(end.output) == output
            completed = [e.task_id for e in events if isinstance(e, TaskCompleted)]
            assert sorted(completed) == sorted(set(completed)) and len(completed) == 3, instance
        assert not problems, "\n".join(problems[:30])
        assert set(histories) == set(expected)
        assert not engine.dead_letters()

        settings = engine.settings
        capsys.readouterr()
        code = main(
            [
                "history", "verify", "--all", "--json",
                "--bootstrap-servers", settings.bootstrap_servers,
                "--namespace", settings.namespace, "--quiet",
            ]
        )  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0, captured.out + captured.err
        doc = json.loads(captured.out)
        assert {r["instance_id"] for r in doc["results"]} >= set(expected)
        assert doc["broken"] == 0
        results = _result_records(kafka_bootstrap, engine.topics.activity_results, 4)
        assert results >= 3 * WORKFLOWS
        print(f"activity results on the topic: {results} for {3 * WORKFLOWS} completions")
