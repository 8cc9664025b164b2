"""Task queues on the real broker: two kinds of worker with disjoint activities in one
namespace, and a task that reaches a worker lacking its activity."""

from __future__ import annotations

import pytest

from engine.adapters.kafka_worker import KafkaWorker
from engine.codec import decode_message
from engine.core.messages import ActivityResult, ActivityTask
from engine.runtime.registry import Registry
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
    outcomes = [r for r in results if isinstance(r, ActivityResult) and not r.unserved]
    assert len(outcomes) == 1 and outcomes[0].failure is None
