"""Exactly once across crashes: 500 workflows run while the processor and the worker are
SIGKILLed several times at random moments and restarted with the same ids.

Afterwards every workflow has completed once with the right output, and the history topic
(read_committed) is exactly what a crash-free run would have written: per instance a
contiguous sequence from 0, one start and one end, an intact hash chain, and each activity
attempt's result applied once.

The random moments come from a seed printed at the start (``CRASH_SEED=<n>`` replays it).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from engine_harness import EngineProcess, history_problems, running_engine

from engine.adapters.kafka.config import consumer_config
from engine.adapters.kafka.io import RecordRejectedError
from engine.adapters.kafka.processor import ProcessorRunner
from engine.core.errors import BrokerError
from engine.core.history import (
    ExecutionCompleted,
    InlineStepCompleted,
    RuntimeStatus,
    TaskCompleted,
    TimerFired,
)
from engine.core.payloads import from_payload
from engine.runtime.registry import default_registry

pytestmark = pytest.mark.kafka

WORKFLOWS = 500
KILLS_EACH = 3
START_SECONDS = 36.0
#: What a processor or worker logs once it owns partitions.
ACTIVE = {"processor-0": "restored:", "worker-0": "assigned ["}
WAIT = 240.0


@pytest.mark.slow
def test_workflows_complete_exactly_once_through_sigkills(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("CRASH_SEED", time.time_ns() % 1_000_000))
    print(f"CRASH_SEED={seed}")
    rng = random.Random(seed)
    with running_engine(
        kafka_bootstrap, partitions=8, in_process=False, state_dir=tmp_path
    ) as engine:
        processor = engine.processors["processor-0"]
        worker = engine.workers["worker-0"]
        assert isinstance(processor, EngineProcess) and isinstance(worker, EngineProcess)
        client = engine.client
        expected: dict[str, tuple[str, int]] = {}
        starter_error: list[BaseException] = []

        def start_all() -> None:
            try:
                batch = 20
                pause = START_SECONDS / (WORKFLOWS / batch)
                for first in range(0, WORKFLOWS, batch):
                    for i in range(first, first + batch):
                        if i % 2:
                            instance = client.start("chain3.activities", i, flush=False)
                            expected[instance] = ("chain3.activities", i + 3)
                        else:
                            spec = {"sleep": rng.uniform(0.2, 3.0), "x": i}
                            instance = client.start("t.timer_inline", spec, flush=False)
                            expected[instance] = ("t.timer_inline", 2 * i)
                    client.flush()
                    time.sleep(pause)
            except BaseException as exc:
                starter_error.append(exc)

        starter = threading.Thread(target=start_all, name="starter")
        starter.start()
        # alternate the victims, so one restarts (waiting for its dead predecessor's group
        # session to expire) while the other is being killed; each is killed only once its
        # current incarnation owns partitions, at a random moment of its work after that
        pair = [processor, worker] if rng.random() < 0.5 else [worker, processor]
        victims = pair * KILLS_EACH
        kills = []
        for victim in victims:
            victim.wait_for_log(ACTIVE[victim.name], 120)
            time.sleep(rng.uniform(0.2, 3.0))
            assert victim.alive, f"{victim.name} exited by itself:\n{engine.logs()}"
            victim.kill()
            kills.append(victim.name)
            time.sleep(rng.uniform(0.0, 1.0))
            victim.start()
        starter.join()
        assert not starter_error, starter_error
        assert len(expected) == WORKFLOWS
        assert sorted(kills) == ["processor-0"] * KILLS_EACH + ["worker-0"] * KILLS_EACH

        for instance, (_, output) in expected.items():
            state = engine.wait_for_completion(instance, WAIT)
            assert state.status is RuntimeStatus.COMPLETED, (instance, state.failure)
            assert state.output == output
        assert processor.alive and worker.alive, engine.logs()
        assert processor.starts == worker.starts == KILLS_EACH + 1

        statuses = engine.final_statuses()
        histories = engine.history_records()
        problems: list[str] = []
        for instance, (name, output) in expected.items():
            status = statuses[instance]
            assert status.status is RuntimeStatus.COMPLETED
            assert from_payload(status.output) == output
            assert status.generation == 0
            records = histories[instance]
            problems += history_problems(instance, records)
            events = [e for _, e in records]
            [end] = [e.body for e in events if isinstance(e.body, ExecutionCompleted)]
            assert from_payload(end.output) == output
            assert {e.generation for e in events} == {0}
            if name == "chain3.activities":
                assert sum(isinstance(e.body, TaskCompleted) for e in events) == 3, instance
            else:
                assert sum(isinstance(e.body, TimerFired) for e in events) == 1, instance
                assert sum(isinstance(e.body, InlineStepCompleted) for e in events) == 1
        assert not problems, "\n".join(problems[:30])
        assert set(histories) == set(expected), "no history for anything else"
        assert not engine.dead_letters()


def test_an_error_in_the_middle_of_a_transaction_commits_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A replica that stops on an error while its transaction is open must not commit the
    batch's input offsets on the way out (closing the consumer revokes its partitions, and
    the revocation commits pending work), and must report that error. Here every record is
    refused: the instance's turn is refused, then its failure too, so the replica stops."""
    with running_engine(
        kafka_bootstrap, partitions=2, replicas=0, workers=0, state_dir=tmp_path
    ) as engine:
        settings = replace(engine.settings, replica_id="processor-0", state_dir=str(tmp_path))
        runner = ProcessorRunner(settings, default_registry)

        def refuse(*args: object, **kwargs: object) -> None:
            raise RecordRejectedError("refused by the test")

        runner._producer.produce = refuse  # type: ignore[method-assign]
        instance = engine.client.start("t.echo", "once", wait=False)  # no replica runs yet
        stop = threading.Event()
        watchdog = threading.Timer(60, stop.set)
        watchdog.start()
        try:
            with pytest.raises(BrokerError, match="again after failing it alone") as caught:
                runner.run(stop)
            assert "refused by the test" in str(caught.value)
        finally:
            watchdog.cancel()
        assert not stop.is_set(), "the replica never saw the start"

        assert not engine.histories(), "nothing of the failed batch was written"
        consumer = Consumer(consumer_config(engine.bootstrap, settings.processor_group))
        try:
            committed = consumer.committed(
                [TopicPartition(engine.topics.commands, p) for p in range(2)], timeout=30
            )
        finally:
            consumer.close()
        assert all(tp.offset < 0 for tp in committed), committed

        # a healthy replica with the same id redoes the batch: the workflow runs once
        engine.start_processor("processor-0")
        state = engine.wait_for_completion(instance, 60)
        assert (state.status, state.output) == (RuntimeStatus.COMPLETED, "once")
        records = engine.history_records()
        assert set(records) == {instance}
        assert not history_problems(instance, records[instance])
