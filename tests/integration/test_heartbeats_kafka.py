"""Heartbeats and cancellation on the real broker: a heartbeat-timeout retry resumes from
the last details; a terminated instance's activity, and one that lost a when_any, are
cancelled on their worker."""

from __future__ import annotations

import pytest

from engine.adapters.kafka.worker import KafkaWorker
from tests import heartbeat_workflows as hw
from tests.engine_harness import RunningEngine, ThreadProcess, running_engine, wait_until

pytestmark = pytest.mark.kafka

MODULES = ["tests.heartbeat_workflows"]


def _start_worker(engine: RunningEngine) -> KafkaWorker:
    worker = KafkaWorker(engine.settings, hw.activities, worker_id="hb", shutdown_timeout_s=5)
    engine.workers["hb"] = ThreadProcess("hb", worker.run).start()
    return worker


def test_a_heartbeat_timeout_retry_resumes_from_the_last_details(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, workers=0, modules=MODULES) as engine:
        worker = _start_worker(engine)
        instance = engine.client.start("hb.count", 6)
        final = engine.wait_for_completion(instance)
        assert final.output == {"attempt": 2, "resumed_from": 3}
        assert hw.observed[instance] == [("attempt", 1, "from", 0), ("attempt", 2, "from", 3)]
        assert worker.worker.stats["failures"] == 1  # the timed-out attempt


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_terminated_instances_activity_is_cancelled_on_the_worker(
    kafka_bootstrap: str, kind: str
) -> None:
    with running_engine(kafka_bootstrap, workers=0, modules=MODULES) as engine:
        worker = _start_worker(engine)
        instance = engine.client.start("hb.wait", kind)
        wait_until(lambda: worker.worker.running == 1, what="the activity to start")
        engine.client.terminate(instance, "not needed any more")
        assert engine.wait_for_completion(instance).status.value == "TERMINATED"
        expected = "async got CancelledError" if kind == "async" else "sync saw is_cancelled"
        wait_until(lambda: hw.observed.get(instance) == [expected], what=expected)
        wait_until(lambda: worker.worker.stats["cancelled"] == 1, what="the cancelled count")
        assert worker.worker.stats["failures"] == 0 and worker.worker.stats["results"] == 0


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_when_any_losers_activity_is_cancelled_on_the_worker(
    kafka_bootstrap: str, kind: str
) -> None:
    with running_engine(kafka_bootstrap, workers=0, modules=MODULES) as engine:
        worker = _start_worker(engine)
        instance = engine.client.start("hb.race", kind)
        wait_until(lambda: worker.worker.running == 1, what="the activity to start")
        engine.client.raise_event(instance, "go", "the event won")
        assert engine.wait_for_completion(instance).output == "the event won"
        expected = "async got CancelledError" if kind == "async" else "sync saw is_cancelled"
        wait_until(lambda: hw.observed.get(instance) == [expected], what=expected)
        wait_until(lambda: worker.worker.stats["cancelled"] == 1, what="the cancelled count")
        assert worker.worker.stats["failures"] == 0 and worker.worker.stats["results"] == 0
