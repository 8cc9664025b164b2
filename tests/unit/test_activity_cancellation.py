"""Cancellation: the processor tells the worker when the workflow stops waiting for an
attempt, and the worker stops it (async: CancelledError; sync: is_cancelled() and a
raising heartbeat) and records it as cancelled, not failed. The Kafka side:
tests/integration/test_heartbeats_kafka.py."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from engine import Registry, RetryPolicy, WorkflowContext
from engine.adapters.metrics import WorkerMetrics
from engine.codec import decode_message, encode_message
from engine.core.messages import ActivityCancel, ActivityTask
from engine.core.payloads import to_payload
from engine.services.worker.worker import Outbound, TaskRecord, Worker
from engine.testing import TestEngine
from tests import heartbeat_workflows as hw

registry = Registry()


@registry.workflow(name="waits")
async def waits(ctx: WorkflowContext, timeout: float) -> str:
    try:
        await ctx.call_activity("elsewhere", None, start_to_close=timeout, retry=None)
    except Exception as exc:
        return type(exc).__name__
    return "done"


@registry.workflow(name="retries")
async def retries(ctx: WorkflowContext, _: object) -> str:
    policy = RetryPolicy(max_attempts=2, initial_interval=0)
    await ctx.call_activity("elsewhere", None, start_to_close=5, retry=policy)
    return "done"


def _cancels(env: TestEngine) -> list[ActivityCancel]:
    values = [decode_message(r.value) for r in env.records("activity-tasks") if r.value]
    return [v for v in values if isinstance(v, ActivityCancel)]


def test_terminating_an_instance_cancels_its_open_attempt() -> None:
    # no worker here registers "elsewhere": the task stays open, as on a busy worker
    with TestEngine(registry) as env:
        env.start("waits", 0, instance_id="t")
        env.run()
        assert _cancels(env) == []
        env.terminate("t", "no longer needed")
        env.run()
        [cancel] = _cancels(env)
    assert (cancel.instance_id, cancel.task_id, cancel.attempt) == ("t", 0, 1)
    assert "TERMINATED" in cancel.reason


def test_a_cold_instance_still_cancels_what_it_stops_waiting_for() -> None:
    """Evicted from the cache, the instance is replayed for its next turn; the turn runs
    live, so the runtime reports the attempts it stops waiting for as a hot one would."""
    with TestEngine(registry) as env:
        env.start("waits", 0, instance_id="c")
        env.start("retries", None, instance_id="r")
        env.run()
        for pp in env.processors.values():
            pp.cache.clear()
        env.terminate("c", "no longer needed")
        env.run()
        for pp in env.processors.values():
            pp.cache.clear()
        env.advance(6)  # r's attempt 1 times out; attempt 2 replaces it
        cancels = {(c.instance_id, c.task_id, c.attempt) for c in _cancels(env)}
    assert cancels == {("c", 0, 1), ("r", 0, 1)}


def test_a_timed_out_attempt_is_cancelled_when_its_retry_replaces_it() -> None:
    with TestEngine(registry) as env:
        env.start("retries", None, instance_id="r")
        env.advance(6)  # attempt 1 times out; attempt 2 is scheduled
        cancels = _cancels(env)
        tasks = [
            t.attempt
            for r in env.records("activity-tasks")
            if r.value and isinstance(t := decode_message(r.value), ActivityTask)
        ]
    assert tasks == [1, 2]
    assert [(c.task_id, c.attempt) for c in cancels] == [(0, 1)]


def test_a_completed_attempt_is_not_cancelled() -> None:
    with TestEngine(hw_registry()) as env:
        env.start("hb.count", 2, instance_id="completes")
        env.wait_for_completion("completes")
        assert _cancels(env) == []


def hw_registry() -> Registry:
    reg = Registry()
    reg.add_workflow(hw.count_flow, name="hb.count")
    reg.add_activity(hw.count, name="hb.count")
    return reg


# --- the worker's side --------------------------------------------------------------------------


def _worker() -> Worker:
    worker = Worker(hw.activities, source_topic="t.activity-tasks", concurrency=2)
    worker.assigned([0])
    return worker


def _record(message: ActivityTask | ActivityCancel, offset: int) -> TaskRecord:
    return TaskRecord(0, offset, message.instance_id.encode(), encode_message(message), 0)


def _until_idle(worker: Worker) -> list[Outbound]:
    out: list[Outbound] = []
    deadline = time.monotonic() + 30
    while worker.running and time.monotonic() < deadline:
        out.extend(worker.collect(0.05))
    return out


def _wait_for_note(instance_id: str) -> None:
    deadline = time.monotonic() + 30
    while instance_id not in hw.observed and time.monotonic() < deadline:
        time.sleep(0.02)


def test_an_async_activity_gets_cancelled_error_and_nothing_is_reported() -> None:
    worker = _worker()
    worker.accept([_record(ActivityTask("a1", 0, 4, 1, "hb.wait_async", to_payload(None)), 0)])
    time.sleep(0.2)  # let it start awaiting
    worker.accept([_record(ActivityCancel("a1", 0, 4, 1, "terminated"), 1)])
    assert _until_idle(worker) == []
    _wait_for_note("a1")
    assert hw.observed["a1"] == ["async got CancelledError"]
    assert worker.stats["cancelled"] == 1 and worker.stats["failures"] == 0
    assert worker.offsets.to_commit() == {0: 2}
    worker.shutdown()


def test_a_sync_activity_sees_is_cancelled() -> None:
    worker = _worker()
    worker.accept([_record(ActivityTask("s1", 0, 4, 1, "hb.wait_sync", to_payload(None)), 0)])
    worker.accept([_record(ActivityCancel("s1", 0, 4, 1, "terminated"), 1)])
    assert _until_idle(worker) == []
    _wait_for_note("s1")  # the activity notices at its next check
    assert hw.observed["s1"] == ["sync saw is_cancelled"]
    assert worker.stats["cancelled"] == 1
    worker.shutdown()


def test_a_task_waiting_for_a_slot_is_dropped_when_cancelled() -> None:
    worker = Worker(hw.activities, source_topic="t.activity-tasks", concurrency=1)
    worker.assigned([0])
    blocker = ActivityTask("b", 0, 1, 1, "hb.wait_async", to_payload(None))
    queued = ActivityTask("q", 0, 1, 1, "hb.wait_async", to_payload(None))
    worker.accept([_record(blocker, 0), _record(queued, 1)])
    assert worker.queued == 1
    worker.accept([_record(ActivityCancel("q", 0, 1, 1, "lost the race"), 2)])
    assert worker.queued == 0 and worker.stats["cancelled"] == 1
    worker.accept([_record(ActivityCancel("b", 0, 1, 1, "ended"), 3)])
    assert _until_idle(worker) == [] and worker.offsets.to_commit() == {0: 4}
    worker.shutdown()


def test_cancelled_attempts_are_counted_as_cancelled_not_failed() -> None:
    metrics = WorkerMetrics(CollectorRegistry())
    worker = Worker(hw.activities, source_topic="t.activity-tasks", concurrency=1, observer=metrics)
    worker.assigned([0])
    running = ActivityTask("m1", 0, 1, 1, "hb.wait_sync", to_payload(None))
    waiting = ActivityTask("m2", 0, 1, 1, "hb.wait_sync", to_payload(None))
    worker.accept([_record(running, 0), _record(waiting, 1)])
    worker.accept([_record(ActivityCancel("m2", 0, 1, 1, "lost the race"), 2)])
    worker.accept([_record(ActivityCancel("m1", 0, 1, 1, "terminated"), 3)])
    assert _until_idle(worker) == []
    sample = metrics.registry.get_sample_value
    labels = {"activity": "hb.wait_sync"}
    assert sample("turnstile_activity_results_total", {**labels, "result": "cancelled"}) == 2
    assert sample("turnstile_activity_results_total", {**labels, "result": "failure"}) is None
    worker.shutdown()
