"""The activity worker's logic without Kafka: offsets, flow control, results and failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from engine.adapters.metrics import WorkerMetrics
from engine.codec import decode_message, encode_message
from engine.core.activity_info import ActivityContext, activity_scope, current_activity
from engine.core.errors import ApplicationError, TurnstileError
from engine.core.messages import (
    ActivityResult,
    ActivityTask,
    DeadLetter,
    Message,
    StartWorkflow,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime.registry import Registry
from engine.services.worker.worker import (
    REQUEUES_HEADER,
    CommitPolicy,
    FlowAction,
    OffsetTracker,
    Outbound,
    TaskRecord,
    Worker,
    flow_action,
)

TOPIC = "test.activity-tasks"

# --- offsets ---------------------------------------------------------------------------------


def test_commit_stops_at_the_lowest_running_offset() -> None:
    tracker = OffsetTracker()
    tracker.assign([0])
    epochs = [tracker.consumed(0, offset) for offset in range(5)]
    assert tracker.to_commit() == {0: 0}
    tracker.done(0, 1, epochs[1])
    tracker.done(0, 2, epochs[2])
    assert tracker.to_commit() == {0: 0}, "0 still runs: nothing past it is safe"
    tracker.done(0, 0, epochs[0])
    assert tracker.to_commit() == {0: 3}
    tracker.done(0, 4, epochs[4])
    assert tracker.to_commit() == {0: 3}
    tracker.done(0, 3, epochs[3])
    assert tracker.to_commit() == {0: 5}
    tracker.committed({0: 5})
    assert tracker.to_commit() == {}


def test_partitions_are_tracked_independently_and_gaps_in_offsets_are_fine() -> None:
    tracker = OffsetTracker()
    tracker.assign([0, 1])
    e0 = tracker.consumed(0, 10)
    e1 = tracker.consumed(1, 7)
    tracker.consumed(1, 9)  # offset 8 was a transaction marker
    tracker.done(0, 10, e0)
    tracker.done(1, 7, e1)
    assert tracker.to_commit() == {0: 11, 1: 9}


def test_records_of_unassigned_partitions_are_not_tracked() -> None:
    tracker = OffsetTracker()
    assert tracker.consumed(5, 0) is None
    assert tracker.to_commit() == {}


def test_a_reassigned_partition_rejects_completions_of_the_old_assignment() -> None:
    tracker = OffsetTracker()
    tracker.assign([3])
    old = tracker.consumed(3, 0)
    tracker.drop([3])
    assert not tracker.done(3, 0, old)
    tracker.assign([3])
    assert not tracker.done(3, 0, old)
    assert tracker.to_commit() == {}


# --- flow control and commit timing ----------------------------------------------------------


@pytest.mark.parametrize(
    ("load", "paused", "expected"),
    [
        (0, False, FlowAction.NONE),
        (5, False, FlowAction.NONE),
        (6, False, FlowAction.PAUSE),
        (9, False, FlowAction.PAUSE),
        (6, True, FlowAction.NONE),
        (5, True, FlowAction.NONE),
        (4, True, FlowAction.RESUME),
        (0, True, FlowAction.RESUME),
    ],
)
def test_pause_at_the_high_mark_and_resume_at_the_low_mark(
    load: int, paused: bool, expected: FlowAction
) -> None:
    assert flow_action(load, 6, 4, paused) is expected


def test_without_prefetch_the_worker_resumes_as_soon_as_a_slot_is_free(
    registry: Registry,
) -> None:
    worker = Worker(registry, source_topic=TOPIC, concurrency=4, prefetch=0)
    try:
        assert worker.free == 4
        assert worker.flow(paused=True) is FlowAction.RESUME
    finally:
        worker.shutdown()


def test_the_default_prefetch_keeps_a_large_backlog_of_small_tasks(registry: Registry) -> None:
    """Pausing empties the consumer's fetch queue, so the default backlog is large enough
    that a burst of short activities does not pause every few dozen tasks."""
    worker = Worker(registry, source_topic=TOPIC, concurrency=4)
    try:
        assert worker.prefetch >= 1000
        assert worker.free == 4 + worker.prefetch
    finally:
        worker.shutdown()


def test_large_task_records_shrink_the_backlog(registry: Registry) -> None:
    """The backlog holds about 64 MiB of records at most, whatever the prefetch says."""
    worker = Worker(registry, source_topic=TOPIC, concurrency=1, prefetch=1000)
    worker.assigned([0])
    big = encode_message(_task("double", "x" * 4_000_000))
    try:
        worker.accept([_record(big, offset=i) for i in range(40)])
        assert worker.backlog_room < 40, "4 MB tasks: far fewer than 1000 may wait"
        assert worker.flow(paused=False) is FlowAction.PAUSE
        assert worker.free == 0
    finally:
        worker.drop_backlog()
        worker.shutdown()


def test_commit_policy_commits_when_idle_or_after_the_interval() -> None:
    now = [100.0]
    policy = CommitPolicy(0.05, clock=lambda: now[0])
    assert not policy.due(idle=True), "nothing settled: nothing to commit"
    policy.changed()
    assert policy.due(idle=True)
    assert not policy.due(idle=False)
    now[0] += 0.06
    assert policy.due(idle=False)
    policy.committed()
    assert not policy.due(idle=True)


# --- running activities ----------------------------------------------------------------------


def _task(name: str, value: Any = None, *, task_id: int = 1, attempt: int = 1) -> ActivityTask:
    return ActivityTask(
        "wf-1", generation=2, task_id=task_id, attempt=attempt, name=name, input=to_payload(value)
    )


def _record(task: Message | bytes | None, offset: int = 0, partition: int = 0) -> TaskRecord:
    value = task if isinstance(task, bytes | None) else encode_message(task)
    return TaskRecord(partition, offset, b"wf-1", value, 1234)


def _collect(worker: Worker, count: int, timeout: float = 5.0) -> list[Outbound]:
    out: list[Outbound] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(worker.collect(0.01))
    assert len(out) == count, f"expected {count} results, got {len(out)}"
    return out


def _results(worker: Worker, count: int, timeout: float = 5.0) -> list[ActivityResult]:
    """The next ``count`` results, each acknowledged as if by the broker."""
    out = _collect(worker, count, timeout)
    assert all(worker.delivered(r) for r in out)
    results = [decode_message(r.value) for r in out]
    assert all(isinstance(r, ActivityResult) for r in results)
    return [r for r in results if isinstance(r, ActivityResult)]


@pytest.fixture
def registry() -> Registry:
    reg = Registry()

    @reg.activity(name="double")
    def double(x: int) -> int:
        return x * 2

    @reg.activity(name="adouble")
    async def adouble(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    @reg.activity(name="boom")
    def boom(x: Any) -> None:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("outer") from exc

    @reg.activity(name="final")
    def final(x: Any) -> None:
        raise ApplicationError("card declined", type="Declined", non_retryable=True)

    @reg.activity(name="key")
    def key(x: Any) -> str:
        return current_activity().idempotency_key

    @reg.activity(name="akey")
    async def akey(x: Any, ctx: ActivityContext) -> list[Any]:
        return [ctx.idempotency_key, current_activity().attempt]

    @reg.activity(name="noinput")
    def noinput() -> str:
        return "ok"

    @reg.activity(name="unserialisable")
    def unserialisable(x: Any) -> object:
        return object()

    return reg


@pytest.fixture
def worker(registry: Registry) -> Iterator[Worker]:
    w = Worker(registry, source_topic=TOPIC, concurrency=4, worker_id="w-test")
    w.assigned([0])
    yield w
    w.shutdown()


def test_sync_and_async_activities_produce_results_keyed_by_instance(worker: Worker) -> None:
    assert worker.accept([_record(_task("double", 21), 0), _record(_task("adouble", 5), 1)]) == []
    results = sorted(_results(worker, 2), key=lambda r: from_payload(r.output))
    assert [from_payload(r.output) for r in results] == [10, 42]
    assert all(r.failure is None for r in results)
    assert (results[0].instance_id, results[0].generation, results[0].task_id) == ("wf-1", 2, 1)
    assert worker.offsets.to_commit() == {0: 2}
    assert worker.idle


def test_failures_carry_type_message_cause_and_retryability(worker: Worker) -> None:
    worker.accept([_record(_task("boom"), 0), _record(_task("final", task_id=2), 1)])
    by_task = {r.task_id: r for r in _results(worker, 2)}
    boom, final = by_task[1].failure, by_task[2].failure
    assert boom is not None and final is not None
    assert (boom.type, boom.message, boom.retryable) == ("ValueError", "outer", True)
    assert boom.cause is not None and boom.cause.type == "KeyError"
    assert "raise ValueError" in boom.stack
    assert (final.type, final.retryable) == ("Declined", False)


def test_an_unknown_activity_is_never_failed_it_goes_back_to_its_queue(worker: Worker) -> None:
    worker.source_partitions = 3
    worker.assigned([2])
    [note] = worker.accept([_record(_task("nope"), offset=7, partition=2)])
    result = decode_message(note.value)
    assert isinstance(result, ActivityResult)
    assert result.failure is None and result.output is None
    assert "'nope'" in result.unserved and "double" in result.unserved
    assert "--task-queue default" in result.unserved
    assert worker.offsets.to_commit() == {2: 7}  # held: not committed past it yet
    assert not worker.idle and worker.held == 1
    assert worker.delivered(note)
    out: list[Outbound] = []
    deadline = time.monotonic() + 5
    while not out and time.monotonic() < deadline:
        out = worker.collect(0.05)
    [requeued] = out
    assert requeued.requeue_to == 0  # the next partition, wrapping around
    assert requeued.value == _record(_task("nope")).value
    assert dict(requeued.headers)[REQUEUES_HEADER] == b"1"
    assert worker.offsets.to_commit() == {2: 7}, "the requeued copy is not delivered yet"
    assert worker.idle and not worker.settled
    assert worker.delivered(requeued)
    assert worker.offsets.to_commit() == {2: 8} and worker.settled
    assert worker.stats["unserved"] == 1 and worker.stats["failures"] == 0


def test_unserved_tasks_are_counted_per_activity_and_task_queue() -> None:
    metrics = WorkerMetrics(CollectorRegistry())
    w = Worker(Registry(), source_topic=TOPIC, observer=metrics, task_queue="gpu")
    w.assigned([0])
    tasks = [
        ActivityTask("wf-1", 2, n, 1, "render", to_payload(n), task_queue="gpu") for n in (1, 2)
    ]
    w.accept([_record(t, offset=n) for n, t in enumerate(tasks)])
    labels = {"activity": "render", "task_queue": "gpu"}
    assert metrics.registry.get_sample_value("turnstile_activity_unserved_total", labels) == 2
    assert w.stats["failures"] == 0
    assert w.drop_backlog() == 2


def test_a_requeued_task_waits_longer_each_time_it_comes_back() -> None:
    record = _record(_task("nope"))
    again = TaskRecord(0, 1, record.key, record.value, 0, headers=((REQUEUES_HEADER, b"3"),))
    w = Worker(Registry(), source_topic=TOPIC)
    w.assigned([0])
    w.accept([again])
    assert w.collect(0.2) == []  # 0.5 s doubled three times: not due for a while
    assert w.held == 1
    assert w.drop_backlog() == 1 and w.idle


def test_the_idempotency_key_is_available_to_sync_and_async_activities(worker: Worker) -> None:
    worker.accept([_record(_task("key", attempt=3), 0), _record(_task("akey", task_id=2), 1)])
    by_task = {r.task_id: from_payload(r.output) for r in _results(worker, 2)}
    assert by_task[1] == "wf-1/2/1"
    assert by_task[2] == ["wf-1/2/2", 1]


def test_every_attempt_of_a_call_gets_the_same_key_and_its_own_attempt_number(
    worker: Worker,
) -> None:
    worker.accept([_record(_task("akey", attempt=n), n) for n in (1, 2, 3)])
    outputs = [from_payload(r.output) for r in _results(worker, 3)]
    assert sorted(outputs) == [["wf-1/2/1", 1], ["wf-1/2/1", 2], ["wf-1/2/1", 3]]


def test_activities_without_input_and_unserialisable_results(worker: Worker) -> None:
    worker.accept([_record(_task("noinput"), 0), _record(_task("unserialisable", task_id=2), 1)])
    by_task = {r.task_id: r for r in _results(worker, 2)}
    assert from_payload(by_task[1].output) == "ok"
    failure = by_task[2].failure
    assert failure is not None and not failure.retryable and "JSON" in failure.message


def test_undecodable_and_foreign_records_become_dead_letters(worker: Worker) -> None:
    letters = worker.accept(
        [
            _record(b"\x00garbage", 5),
            _record(None, 6),
            _record(StartWorkflow("wf-1", name="x"), 7),
            _record(_task("double", 1), 8),
        ]
    )
    assert [letter.dead for letter in letters] == [True, True, True]
    first = decode_message(letters[0].value)
    assert isinstance(first, DeadLetter)
    assert (first.source_topic, first.source_partition, first.source_offset) == (TOPIC, 0, 5)
    assert first.value == b"\x00garbage" and first.instance_id == "wf-1"
    headers = dict(letters[0].headers)
    assert headers["source-offset"] == b"5" and headers["source-topic"] == TOPIC.encode()
    assert b"undecodable" in headers["reason"]
    _results(worker, 1)
    assert worker.offsets.to_commit() == {0: 5}, "dead letters not delivered yet"
    assert all(worker.delivered(letter) for letter in letters)
    assert worker.offsets.to_commit() == {0: 9}, "delivered dead letters settle their offsets"


def test_load_beyond_concurrency_waits_in_a_backlog(registry: Registry) -> None:
    gate = threading.Event()

    @registry.activity(name="block")
    def block(x: Any) -> None:
        gate.wait(10)

    worker = Worker(registry, source_topic=TOPIC, concurrency=2, prefetch=3)
    worker.assigned([0])
    try:
        worker.accept([_record(_task("block", task_id=i), i) for i in range(5)])
        assert (worker.running, worker.load, worker.free) == (2, 5, 0)
        assert worker.flow(paused=False) is FlowAction.PAUSE
        gate.set()
        _results(worker, 5)
        assert worker.load == 0
        assert worker.flow(paused=True) is FlowAction.RESUME
        assert worker.offsets.to_commit() == {0: 5}
    finally:
        gate.set()
        worker.shutdown()


def test_results_of_revoked_partitions_are_dropped(registry: Registry) -> None:
    gate = threading.Event()

    @registry.activity(name="block")
    def block(x: Any) -> None:
        gate.wait(10)

    worker = Worker(registry, source_topic=TOPIC, concurrency=1)
    try:
        worker.assigned([0, 1])
        worker.accept([_record(_task("block"), 0, 0), _record(_task("double", 1), 0, 1)])
        worker.revoked([0, 1])
        assert worker.load == 1, "the queued task of partition 1 is gone, the running one stays"
        gate.set()
        deadline = time.monotonic() + 5
        while worker.running and time.monotonic() < deadline:
            assert worker.collect(0.01) == []
        assert worker.running == 0
        assert worker.offsets.to_commit() == {}
    finally:
        gate.set()
        worker.shutdown()


def test_records_of_partitions_not_assigned_are_ignored(worker: Worker) -> None:
    assert worker.accept([_record(_task("double", 1), 0, partition=9)]) == []
    assert worker.load == 0 and worker.offsets.to_commit() == {}


def test_an_undelivered_result_is_produced_again_and_holds_its_offset(worker: Worker) -> None:
    [letter] = worker.accept([_record(b"bad", 0), _record(_task("double", 2), 1)])
    [result] = _collect(worker, 1)
    assert worker.delivered(letter)
    assert worker.offsets.to_commit() == {0: 1}, "the result of offset 1 is on its way"
    worker.undelivered(result)
    assert worker.redo_pending and worker.unsent == 1 and not worker.settled
    assert worker.redo() == [result] and worker.redo() == []
    assert worker.offsets.to_commit() == {0: 1}, "produced again, still not delivered"
    assert worker.delivered(result)
    assert worker.offsets.to_commit() == {0: 2} and worker.settled
    worker.committed({0: 2})
    assert worker.offsets.to_commit() == {}
    assert not worker.delivered(result), "a second acknowledgement settles nothing more"


def test_records_waiting_to_be_produced_again_are_dropped_with_their_partition(
    worker: Worker,
) -> None:
    worker.accept([_record(_task("double", 2), 3)])
    [result] = _collect(worker, 1)
    worker.undelivered(result)
    worker.revoked([0])
    assert worker.redo() == [] and worker.unsent == 0
    assert not worker.delivered(result), "a late acknowledgement of a moved partition"
    worker.assigned([0])
    worker.undelivered(result)  # a failure reported after the partition came back
    assert worker.redo() == [], "the old assignment's record is not produced again"


def test_a_rejected_result_is_replaced_by_a_failure(worker: Worker) -> None:
    worker.accept([_record(_task("double", 2))])
    [original] = _collect(worker, 1)
    replaced = worker.replace_rejected(original, "Message size too large")
    result = decode_message(replaced.value)
    assert isinstance(result, ActivityResult) and result.failure is not None
    assert result.failure.type == "ResultRejected" and not result.failure.retryable
    assert (replaced.partition, replaced.offset, replaced.epoch) == (0, 0, original.epoch)
    assert worker.offsets.to_commit() == {0: 0}, "the replacement holds the offset"
    assert worker.delivered(replaced)
    assert worker.offsets.to_commit() == {0: 1}


def test_current_activity_outside_an_activity_says_how_to_test() -> None:
    with pytest.raises(TurnstileError, match="activity_scope"):
        current_activity()
    info = ActivityContext(_task("x"))
    with activity_scope(info):
        assert current_activity().idempotency_key == "wf-1/2/1"


def test_concurrency_must_be_positive(registry: Registry) -> None:
    with pytest.raises(TurnstileError, match="at least 1"):
        Worker(registry, source_topic=TOPIC, concurrency=0)
