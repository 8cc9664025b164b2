"""A cancellation reaches an activity task that went back to its queue unserved.

Such a task is put back one partition further on, away from the partition its instance id
keys to (where a cancellation is sent). The worker that reads a requeued copy tells the
processor where it is; the processor sends the attempt's cancellation there - later, when
the workflow stops waiting, or at once when it already has. The Kafka side:
tests/integration/test_task_queues_kafka.py.
"""

from __future__ import annotations

import time
from typing import Any

from engine import Registry, WorkflowContext, activity
from engine.codec import decode_message, encode_message
from engine.core.messages import ActivityCancel, ActivityResult, ActivityTask
from engine.core.payloads import to_payload
from engine.services.processor import keys
from engine.services.worker.worker import REQUEUES_HEADER, Outbound, TaskRecord, Worker
from engine.testing import TestEngine

registry = Registry()


@registry.activity(name="here")
def here(x: int) -> int:
    deadline = time.monotonic() + 30
    while not activity.is_cancelled() and time.monotonic() < deadline:
        time.sleep(0.01)  # only a cancellation ends it early
    return x


@registry.workflow(name="race")
async def race(ctx: WorkflowContext, _: Any) -> Any:
    winner = await ctx.when_any(
        [ctx.call_activity("elsewhere", None, retry=None), ctx.wait_for_event("go")]
    )
    return await winner


@registry.workflow(name="race-on")
async def race_on(ctx: WorkflowContext, _: Any) -> Any:
    """As ``race``, then it goes on waiting (for an event that never comes here)."""
    await ctx.when_any([ctx.call_activity("elsewhere", None, retry=None), ctx.wait_for_event("go")])
    return await ctx.wait_for_event("end")


@registry.workflow(name="plain")
async def plain(ctx: WorkflowContext, _: Any) -> Any:
    return await ctx.call_activity("elsewhere", None, retry=None)


# --- the worker: where a requeued copy is ---------------------------------------------------------


def _copy(task: ActivityTask, partition: int, offset: int, requeues: int) -> TaskRecord:
    headers = ((REQUEUES_HEADER, str(requeues).encode()),) if requeues else ()
    key = task.instance_id.encode()
    return TaskRecord(partition, offset, key, encode_message(task), 0, headers=headers)


def _note(out: Outbound) -> ActivityResult:
    result = decode_message(out.value)
    assert isinstance(result, ActivityResult)
    return result


def test_a_worker_that_reads_a_requeued_copy_says_where_it_is_before_running_it() -> None:
    worker = Worker(registry, source_topic="t.activity-tasks.gpu", task_queue="gpu")
    worker.assigned([3])
    task = ActivityTask("wf", 0, 5, 2, "here", to_payload(1), task_queue="gpu")
    [note] = worker.accept([_copy(task, 3, 40, requeues=2)])
    result = _note(note)
    assert (result.requeued_to, result.requeues, result.task_queue) == (3, 2, "gpu")
    assert (result.task_id, result.attempt, result.output, result.unserved) == (5, 2, None, "")
    assert worker.running == 1
    assert worker.offsets.to_commit() == {3: 40}  # the note holds the copy until delivered
    worker.accept([_copy_cancel("wf", 0, 5, 2, 3, 41)])
    deadline = time.monotonic() + 10
    while worker.running and time.monotonic() < deadline:
        worker.collect(0.05)
    assert worker.stats["cancelled"] == 1 and worker.stats["results"] == 0
    worker.shutdown()


def _copy_cancel(
    instance: str, gen: int, task_id: int, attempt: int, partition: int, offset: int
) -> TaskRecord:
    cancel = ActivityCancel(instance, gen, task_id, attempt, "the workflow stopped waiting")
    return TaskRecord(partition, offset, instance.encode(), encode_message(cancel), 0)


def test_a_worker_that_lacks_a_requeued_copy_says_where_it_holds_it() -> None:
    worker = Worker(Registry(), source_topic="t.activity-tasks")
    worker.assigned([1])
    task = ActivityTask("wf", 0, 5, 1, "here", to_payload(1))
    [note] = worker.accept([_copy(task, 1, 9, requeues=1)])
    result = _note(note)
    assert result.unserved and (result.requeued_to, result.requeues) == (1, 1)
    assert result.task_queue == "default"
    worker.drop_backlog()


def test_an_original_task_sends_no_location() -> None:
    worker = Worker(Registry(), source_topic="t.activity-tasks")
    worker.assigned([0])
    [note] = worker.accept([_copy(ActivityTask("wf", 0, 5, 1, "here"), 0, 0, requeues=0)])
    assert _note(note).requeued_to == -1  # it is where its key puts it
    worker.drop_backlog()


# --- the processor: where the cancellation goes -----------------------------------------------


def _located(instance: str, partition: int, requeues: int, task_id: int = 0) -> bytes:
    note = ActivityResult(
        instance, 0, task_id, 1, requeued_to=partition, requeues=requeues, task_queue="default"
    )
    return encode_message(note)


def _cancels(env: TestEngine) -> list[tuple[int, ActivityCancel]]:
    out = []
    for r in env.records("activity-tasks"):
        value = decode_message(r.value) if r.value else None
        if isinstance(value, ActivityCancel):
            out.append((r.partition, value))
    return out


def _note_copy(env: TestEngine, instance: str, partition: int, requeues: int) -> None:
    env.produce(
        env.topics.activity_results, instance.encode(), _located(instance, partition, requeues)
    )
    env.run()


def test_a_cancellation_goes_where_the_requeued_copy_is() -> None:
    with TestEngine(registry, partitions=4) as env:
        env.start("race", None, instance_id="r")
        env.run()
        home = env.partition_of("r")
        there = (home + 2) % 4
        _note_copy(env, "r", there, 2)
        _note_copy(env, "r", (home + 1) % 4, 1)  # an older trip's note, late: not where it is
        assert _cancels(env) == [] and env.get("r").status.value == "RUNNING"  # type: ignore[union-attr]
        env.raise_event("r", "go", "won")
        assert env.wait_for_completion("r").output == "won"
        [(partition, cancel)] = _cancels(env)
        assert not _rows(env, "r")  # the attempt is settled: its row went
    assert partition == there and (cancel.task_id, cancel.attempt) == (0, 1)


def _rows(env: TestEngine, instance: str) -> list[bytes]:
    pp = env.processors[env.partition_of(instance)]
    prefix = keys.requeued_prefix(instance)
    return [k for k, _ in pp.tables.store.scan(prefix, prefix + b"\xff")]


def test_a_copy_noted_after_its_attempt_was_cancelled_is_cancelled_at_once() -> None:
    with TestEngine(registry, partitions=4) as env:
        env.start("race", None, instance_id="late")
        env.run()
        env.raise_event("late", "go", "won")
        env.wait_for_completion("late")
        home = env.partition_of("late")
        [(first, _)] = _cancels(env)
        assert first == home  # no copy was known: the key's partition
        env.start("race-on", None, instance_id="late2")  # an instance that still runs
        env.run()
        env.raise_event("late2", "go", "won")
        env.run()
        _note_copy(env, "late", (home + 1) % 4, 1)  # the instance ended meanwhile
        _note_copy(env, "late2", (env.partition_of("late2") + 3) % 4, 3)
        cancels = _cancels(env)
    late2 = env.partition_of("late2")
    assert sorted((c.instance_id, p) for p, c in cancels) == sorted(
        [("late", home), ("late", (home + 1) % 4), ("late2", late2), ("late2", (late2 + 3) % 4)]
    )
    assert all(
        "COMPLETED" in c.reason
        for p, c in cancels
        if (c.instance_id, p) == ("late", (home + 1) % 4)
    )


def test_a_cold_instance_checks_a_late_note_against_what_it_waits_for() -> None:
    with TestEngine(registry, partitions=2) as env:
        env.start("race-on", None, instance_id="cold")
        env.start("plain", None, instance_id="still")
        env.run()
        # the race's activity lost (its cancellation went to the key's partition)...
        pp = env.processors[env.partition_of("cold")]
        env.raise_event("cold", "go", 1, wait=False)  # ...before any note came
        env.step()
        for processor in env.processors.values():
            processor.cache.clear()  # both instances are cold now
        before = len(_cancels(env))
        _note_copy(env, "cold", 1 - env.partition_of("cold"), 1)
        _note_copy(env, "still", 1 - env.partition_of("still"), 1)
        new = _cancels(env)[before:]
        item = pp.cache.get("cold")
        kept = _rows(env, "still")
    assert [(p, c.instance_id) for p, c in new] == [(1 - env.partition_of("cold"), "cold")]
    assert item is not None and not item.requeue_checks
    assert kept, "the plain call still waits: where its copy is stays known"


def test_a_result_of_a_requeued_attempt_drops_its_row() -> None:
    with TestEngine(registry, partitions=2) as env:
        env.start("plain", None, instance_id="done")
        env.run()
        _note_copy(env, "done", 1 - env.partition_of("done"), 1)
        assert _rows(env, "done")
        result = ActivityResult("done", 0, 0, 1, to_payload("ok"))
        env.produce(env.topics.activity_results, b"done", encode_message(result))
        assert env.wait_for_completion("done").output == "ok"
        assert _rows(env, "done") == [] and _cancels(env) == []


def test_the_kafka_worker_reads_the_requeue_count_with_tracing_off() -> None:
    from engine.adapters.kafka.worker import _task_headers

    headers = [("traceparent", b"00-ab-cd-01"), (REQUEUES_HEADER, b"2"), ("other", b"x")]
    assert _task_headers(headers, False) == ((REQUEUES_HEADER, b"2"),)
    assert _task_headers(headers, True) == (
        ("traceparent", b"00-ab-cd-01"),
        (REQUEUES_HEADER, b"2"),
    )
    assert _task_headers(None, False) == ()
