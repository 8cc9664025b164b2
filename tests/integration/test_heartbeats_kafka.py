"""Heartbeats and cancellation on the real broker: a heartbeat-timeout retry resumes from
the last details; a terminated instance's activity is cancelled on its worker."""

from __future__ import annotations

import pytest

from engine.adapters.kafka_worker import KafkaWorker
from tests import heartbeat_workflows as hw
from tests.engine_harness import RunningEngine, ThreadProcess, running_engine

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
