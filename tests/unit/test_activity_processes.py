"""The process executor: sync activities in child processes, killed at their timeout (the
Kafka worker with --executor process: tests/integration/test_activity_timeouts_kafka.py)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from engine.codec import decode_message, encode_message
from engine.core.messages import ActivityCancel, ActivityResult, ActivityTask
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import Registry
from engine.services.worker.worker import Outbound, TaskRecord, Worker
from tests import process_activities

TOPIC = "t.activity-tasks"


def _worker() -> Worker:
    reg = Registry()
    reg.add_activity(process_activities.hang, name="hang")
    reg.add_activity(process_activities.quick, name="quick")
    reg.add_activity(process_activities.boom, name="boom")
    worker = Worker(reg, source_topic=TOPIC, concurrency=4, executor="process")
    worker.assigned([0])
    return worker


def _results(worker: Worker, count: int) -> list[ActivityResult]:
    out: list[Outbound] = []
    deadline = time.monotonic() + 60
    while len(out) < count and time.monotonic() < deadline:
        out.extend(worker.collect(0.05))
    results = [decode_message(r.value) for r in out]
    assert len(results) == count and all(isinstance(r, ActivityResult) for r in results)
    return [r for r in results if isinstance(r, ActivityResult)]


def _record(task: ActivityTask, offset: int) -> TaskRecord:
    return TaskRecord(0, offset, b"i", encode_message(task), 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sync_activity_past_its_timeout_is_killed(tmp_path: Path) -> None:
    worker = _worker()
    pid_file = tmp_path / "pid"
    task = ActivityTask("i", 0, 1, 1, "hang", to_payload(str(pid_file)), timeout_ms=4000)
    worker.accept([_record(task, 0)])
    [result] = _results(worker, 1)
    assert result.failure is not None and result.failure.type == "ActivityTimeoutError"
    assert "was killed" in result.failure.message and result.failure.retryable
    named = re.search(r"pid (\d+)", result.failure.message)
    assert named is not None
    pid = int(named.group(1))
    assert pid != os.getpid() and not _alive(pid)
    if pid_file.exists():  # a child that took its whole timeout to start never wrote it
        assert int(pid_file.read_text()) == pid
    assert worker.runner.killed == 1 and worker.idle
    worker.shutdown()


def test_a_cancelled_attempt_has_its_process_killed_and_reports_nothing(tmp_path: Path) -> None:
    worker = _worker()
    pid_file = tmp_path / "pid"
    task = ActivityTask("i", 0, 1, 1, "hang", to_payload(str(pid_file)), timeout_ms=60_000)
    worker.accept([_record(task, 0)])
    out: list[Outbound] = []
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        out.extend(worker.collect(0.05))
    pid = int(pid_file.read_text())
    worker.accept(
        [TaskRecord(0, 1, b"i", encode_message(ActivityCancel("i", 0, 1, 1, "ended")), 0)]
    )
    while worker.running and time.monotonic() < deadline:
        out.extend(worker.collect(0.05))
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out == [] and not _alive(pid)
    assert worker.stats["cancelled"] == 1 and worker.stats["failures"] == 0
    assert worker.offsets.to_commit() == {0: 2}
    worker.shutdown()


def test_results_failures_and_the_context_come_back_from_the_child() -> None:
    worker = _worker()
    worker.accept(
        [
            _record(ActivityTask("i", 0, 1, 2, "quick", to_payload(21)), 0),
            _record(ActivityTask("i", 0, 2, 1, "boom", to_payload(3)), 1),
        ]
    )
    by_task = {r.task_id: r for r in _results(worker, 2)}
    value, key, pid = from_payload(by_task[1].output)
    assert value == 42 and key == "i/0/1" and pid != os.getpid()
    failure = by_task[2].failure
    assert failure is not None and (failure.type, failure.message) == ("ValueError", "bad 3")
    worker.shutdown()


def test_an_unknown_executor_is_refused() -> None:
    with pytest.raises(Exception, match="unknown activity executor 'fork'"):
        Worker(Registry(), source_topic=TOPIC, executor="fork")
