"""Activity timeouts with a real broker: a sync activity past its start-to-close timeout in
the process executor is stopped (its process killed), and the workflow sees the timeout.
(The kill at the worker's own timeout, without a processor:
tests/unit/test_activity_processes.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.adapters.kafka.worker import KafkaWorker
from engine.runtime.registry import Registry
from tests import process_activities
from tests.engine_harness import ThreadProcess, running_engine, wait_until

pytestmark = pytest.mark.kafka


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_process_executor_stops_a_sync_activity_at_its_timeout(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    registry = Registry()
    registry.add_activity(process_activities.hang, name="proc.hang")
    with running_engine(kafka_bootstrap, workers=0, modules=["tests.process_activities"]) as engine:
        worker = KafkaWorker(
            engine.settings, registry, worker_id="proc", executor="process", shutdown_timeout_s=5
        )
        engine.workers["proc"] = ThreadProcess("proc", worker.run).start()
        pid_file = tmp_path / "pid"
        instance = engine.client.start("proc.hang", str(pid_file))
        final = engine.wait_for_completion(instance)
        # the worker kills it at the attempt's deadline, the workflow's timer fires then
        # too: whichever is recorded first, the call failed with a timeout
        assert "ActivityTimeoutError" in final.output
        # the worker kills the child at the attempt's deadline, or a moment before when the
        # workflow's timer won and its ActivityCancel came first: either way it is gone
        wait_until(
            lambda: worker.worker.runner.killed + worker.worker.stats["cancelled"] >= 1,
            what="the worker to stop the attempt",
        )
        if pid_file.exists():  # a child that took its whole timeout to start never wrote it
            pid = int(pid_file.read_text())
            assert pid != os.getpid()
            wait_until(lambda: not _alive(pid), what="the activity's process to be killed")
        assert worker.worker.stats["results"] <= 1
