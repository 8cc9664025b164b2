"""Task queues on the real broker: two kinds of worker with disjoint activities in one
namespace, a task that reaches a worker lacking its activity, and the cancellation of such
a task after it went on to a worker that has it."""

from __future__ import annotations

import itertools

import pytest

from engine.adapters.kafka.worker import KafkaWorker
from engine.codec import decode_message
from engine.core.history import TaskCompleted
from engine.core.keys import murmur2_partition
from engine.core.messages import ActivityCancel, ActivityResult, ActivityTask
from engine.runtime.registry import Registry
from tests import heartbeat_workflows as hw
from tests.engine_harness import RunningEngine, ThreadProcess, running_engine, wait_until
from tests.task_queue_workflows import gpu_activities, mail_activities

pytestmark = pytest.mark.kafka


def _start(engine: RunningEngine, name: str, registry: Registry, queue: str) -> KafkaWorker:
    worker = KafkaWorker(
        engine.settings, registry, worker_id=name, task_queue=queue, shutdown_timeout_s=5.0
    )
    engine.workers[name] = ThreadProcess(name, worker.run).start()
    return worker


def test_two_kinds_of_worker_on_their_own_queues_complete_both_workflows(
    kafka_bootstrap: str,
) -> None:
    with running_engine(
        kafka_bootstrap, workers=0, modules=["tests.task_queue_workflows"]
    ) as engine:
        gpu = _start(engine, "gpu-box", gpu_activities, "gpu")
        mailer = _start(engine, "mailer", mail_activities, "default")
        renders = [engine.client.start("tq.render", i) for i in range(3)]
        mails = [engine.client.start("tq.mail", i) for i in range(3)]
        for i, instance in enumerate(renders):
            assert engine.wait_for_completion(instance).output == i * 10
        for i, instance in enumerate(mails):
            assert engine.wait_for_completion(instance).output == f"sent {i}"
        gpu_tasks = [decode_message(r.value) for r in engine.read(engine.topics.task_queue("gpu"))]
        default_tasks = [decode_message(r.value) for r in engine.read(engine.topics.activity_tasks)]
        results = [decode_message(r.value) for r in engine.read(engine.topics.activity_results)]
    assert {t.name for t in gpu_tasks if isinstance(t, ActivityTask)} == {"tq.render"}
    assert {t.name for t in default_tasks if isinstance(t, ActivityTask)} == {"tq.send"}
    assert len(gpu_tasks) == 3 and len(default_tasks) == 3
    # each worker saw only tasks it serves: no failures, no unserved notes
    assert all(isinstance(r, ActivityResult) and not r.unserved for r in results)
    assert all(r.failure is None for r in results if isinstance(r, ActivityResult))
    assert gpu.worker.stats["tasks"] == 3 and mailer.worker.stats["tasks"] == 3


def test_a_task_for_a_worker_that_lacks_it_waits_for_one_that_has_it(
    kafka_bootstrap: str,
) -> None:
    with running_engine(
        kafka_bootstrap, workers=0, modules=["tests.task_queue_workflows"]
    ) as engine:
        # a worker of the default queue that does not register tq.send
        lacking = _start(engine, "old-mailer", Registry(), "default")
        instance = engine.client.start("tq.mail", 7)
        status = wait_until(
            lambda: (s := engine.client.get(instance)) is not None and s.unserved and s,
            what="the status to say that no worker serves tq.send",
        )
        assert status.status.value == "RUNNING"
        assert "'tq.send'" in status.unserved and "old-mailer" in status.unserved
        assert lacking.worker.stats["unserved"] >= 1
        assert lacking.worker.stats["failures"] == 0
        _start(engine, "mailer", mail_activities, "default")
        final = engine.wait_for_completion(instance)
        results = [decode_message(r.value) for r in engine.read(engine.topics.activity_results)]
    assert final.output == "sent 7" and final.unserved == ""
    outcomes = [  # notes (unserved; where a requeued copy is) are not outcomes
        r for r in results if isinstance(r, ActivityResult) and not r.unserved and r.requeued_to < 0
    ]
    assert len(outcomes) == 1 and outcomes[0].failure is None


def test_a_cancellation_reaches_a_task_requeued_to_another_worker(kafka_bootstrap: str) -> None:
    """The task lands on the partition of a worker that lacks the activity, which puts it
    back on the next partition, owned by a worker that runs it; the workflow then stops
    waiting (its when_any is won by an event): the cancellation must reach that worker."""
    modules = ["tests.task_queue_workflows", "tests.heartbeat_workflows"]
    with running_engine(kafka_bootstrap, partitions=2, workers=0, modules=modules) as engine:
        lacking = _start(engine, "old-worker", Registry(), "default")
        having = _start(engine, "new-worker", hw.activities, "default")
        wait_until(
            lambda: lacking.worker.offsets.partitions() and having.worker.offsets.partitions(),
            what="one task partition for each worker",
        )
        [home] = lacking.worker.offsets.partitions()
        instance = next(
            f"requeued-{i}"
            for i in itertools.count()
            if murmur2_partition(f"requeued-{i}".encode(), 2) == home
        )
        engine.client.start("hb.race", "sync", instance_id=instance)
        wait_until(lambda: having.worker.running == 1, what="the requeued copy to run")
        assert lacking.worker.stats["unserved"] == 1 and having.worker.stats["tasks"] == 1
        engine.client.raise_event(instance, "go", "the event won")
        assert engine.wait_for_completion(instance).output == "the event won"
        wait_until(
            lambda: hw.observed.get(instance) == ["sync saw is_cancelled"],
            what="the attempt on the worker that has it to see is_cancelled()",
        )
        wait_until(lambda: having.worker.stats["cancelled"] == 1, what="the cancelled count")
        assert having.worker.stats["results"] == 0  # its late result is dropped
        tasks = engine.read(engine.topics.activity_tasks)
        history = engine.history(instance)
    cancels = [(r.partition, decode_message(r.value)) for r in tasks if r.value]
    cancels = [(p, c) for p, c in cancels if isinstance(c, ActivityCancel)]
    assert [p for p, _ in cancels] == [1 - home]  # where the copy went, not the key's partition
    assert not any(isinstance(e.body, TaskCompleted) for e in history)
