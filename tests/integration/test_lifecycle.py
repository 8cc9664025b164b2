"""The instance lifecycle end to end: client -> Kafka -> processor (+ worker) -> status.

One engine (processor replica and worker as threads of the test process) serves the whole
module; every test uses its own instance ids. Waits are bounded guards against hanging,
never performance assertions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from engine_harness import RunningEngine, running_engine, wait_until

from engine.core.errors import (
    InstanceNotRunningError,
    InstanceStillRunningError,
    WorkflowAlreadyRunningError,
)
from engine.core.history import (
    ContinuedAsNew,
    EventRaised,
    ExecutionCompleted,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    HistoryEvent,
    RuntimeStatus,
    TaskCompleted,
    TaskFailed,
    TaskScheduled,
    TimerCreated,
    TimerFired,
)
from engine.core.keys import murmur2_partition
from engine.core.messages import IdReusePolicy, StartWorkflow
from engine.core.payloads import from_payload, to_payload

pytestmark = pytest.mark.kafka

WAIT = 60.0
PARTITIONS = 4


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=PARTITIONS) as running:
        yield running


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def bodies(events: list[HistoryEvent], kind: type) -> list[Any]:
    return [e.body for e in events if isinstance(e.body, kind)]


def wait_status(engine: RunningEngine, instance_id: str, *wanted: RuntimeStatus) -> Any:
    def current() -> Any:
        state = engine.client.get(instance_id)
        return state if state is not None and state.status in wanted else None

    return wait_until(current, WAIT, what=f"{instance_id} to be {[w.value for w in wanted]}")


def wait_history(engine: RunningEngine, instance_id: str, predicate: Any) -> list[HistoryEvent]:
    def ready() -> list[HistoryEvent] | None:
        events = engine.history(instance_id)
        return events if predicate(events) else None

    return wait_until(ready, WAIT, interval=0.2, what=f"history of {instance_id}")


# --- start -> complete ------------------------------------------------------------------------


@pytest.mark.parametrize("workflow", ["chain3.inline", "chain3.activities"])
def test_chain3_completes_with_input_plus_three(engine: RunningEngine, workflow: str) -> None:
    instance = engine.client.start(workflow, 39)
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output == 42
    assert state.name == workflow
    events = engine.history(instance)
    assert [e.sequence for e in events] == list(range(len(events)))
    assert len(bodies(events, ExecutionStarted)) == 1
    [completed] = bodies(events, ExecutionCompleted)
    assert from_payload(completed.output) == 42
    if workflow == "chain3.activities":
        assert len(bodies(events, TaskScheduled)) == 3
        assert len(bodies(events, TaskCompleted)) == 3


def test_order_is_shipped_when_approved_through_the_client(engine: RunningEngine) -> None:
    instance = new_id("order")
    engine.client.start("orders.order", {"order_id": instance, "amount": 5}, instance_id=instance)
    state = wait_until(
        lambda: (
            (s := engine.client.get(instance)) is not None
            and s.custom_status == "awaiting approval"
        ),
        WAIT,
        what="the order to wait for approval",
    )
    assert state
    engine.client.raise_event(instance, "approval", {"approved": True})
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output["status"] == "shipped"
    assert state.output["tracking"] == f"tracking-parcel-{instance}"
    assert state.custom_status == "done"
    child = engine.client.wait_for_completion(f"{instance}:ship", WAIT)
    assert child.status is RuntimeStatus.COMPLETED
    assert child.raw.parent_instance_id == instance


def test_order_is_refunded_when_the_approval_times_out(engine: RunningEngine) -> None:
    instance = new_id("order")
    order = {"order_id": instance, "amount": 7, "approval_timeout_s": 0.5}
    engine.client.start("orders.order", order, instance_id=instance)
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output["status"] == "refunded"
    assert state.output["refunded"] == f"ch-{instance}"
    events = engine.history(instance)
    assert bodies(events, TimerFired), "the approval deadline is a durable timer"
    assert engine.client.get(f"{instance}:ship") is None, "nothing was shipped"


def test_an_event_raised_before_the_start_is_kept_and_applied(engine: RunningEngine) -> None:
    instance = new_id("early")
    engine.client.raise_event(instance, "go", {"early": True})
    engine.client.start("t.wait_event", {}, instance_id=instance)
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output == {"input": {}, "got": {"early": True}}
    raised = bodies(engine.history(instance), EventRaised)
    assert [(r.name, from_payload(r.input)) for r in raised] == [("go", {"early": True})]


# --- terminate, suspend, resume, purge ----------------------------------------------------------


def test_terminate_a_running_instance(engine: RunningEngine) -> None:
    instance = engine.client.start("t.wait_event", {})
    wait_status(engine, instance, RuntimeStatus.RUNNING)
    engine.client.terminate(instance, "no longer needed")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.TERMINATED
    [completed] = bodies(engine.history(instance), ExecutionCompleted)
    assert completed.status is RuntimeStatus.TERMINATED
    # an event after the end is refused, not applied
    with pytest.raises(InstanceNotRunningError, match="TERMINATED"):
        engine.client.raise_event(instance, "go", 1)
    # a marker on the same partition, sent after the event: once it completed, the event
    # was handled
    again = engine.client.start("t.echo", "marker", instance_id=same_partition_id(instance, "m"))
    engine.client.wait_for_completion(again, WAIT)
    assert engine.client.get(instance).status is RuntimeStatus.TERMINATED
    assert not bodies(engine.history(instance), EventRaised)


def test_recursive_terminate_ends_parent_and_child(engine: RunningEngine) -> None:
    parent = new_id("parent")
    child = f"{parent}:child"
    engine.client.start("t.parent_with_child", {}, instance_id=parent)
    wait_status(engine, child, RuntimeStatus.RUNNING)
    engine.client.terminate(parent, "stop everything", recursive=True)
    assert engine.client.wait_for_completion(parent, WAIT).status is RuntimeStatus.TERMINATED
    assert engine.client.wait_for_completion(child, WAIT).status is RuntimeStatus.TERMINATED


def test_request_cancel_lets_the_child_clean_up_when_the_parent_completes(
    engine: RunningEngine,
) -> None:
    parent = new_id("rc")
    engine.client.start("t.parent_close", {"policy": "REQUEST_CANCEL"}, instance_id=parent)
    wait_status(engine, f"{parent}:kid0", RuntimeStatus.RUNNING)
    engine.client.raise_event(parent, "finish")
    assert engine.client.wait_for_completion(parent, WAIT).status is RuntimeStatus.COMPLETED
    child = engine.client.wait_for_completion(f"{parent}:kid0", WAIT)
    assert child.status is RuntimeStatus.CANCELLED
    assert child.failure is not None and child.failure.type == "CancelledError"
    assert child.custom_status == "cleaned up"


def test_recursive_terminate_reaches_children_of_earlier_generations(
    engine: RunningEngine,
) -> None:
    parent = new_id("gens")
    engine.client.start(
        "t.parent_close", {"policy": "ABANDON", "generations": 2}, instance_id=parent
    )
    for generation in range(3):
        wait_status(engine, f"{parent}:kid{generation}", RuntimeStatus.RUNNING)
    engine.client.terminate(parent, "stop everything", recursive=True)
    assert engine.client.wait_for_completion(parent, WAIT).status is RuntimeStatus.TERMINATED
    for generation in range(3):
        state = engine.client.wait_for_completion(f"{parent}:kid{generation}", WAIT)
        assert state.status is RuntimeStatus.TERMINATED


def test_events_raised_while_suspended_apply_after_resume(engine: RunningEngine) -> None:
    instance = engine.client.start("t.wait_event", {})
    wait_status(engine, instance, RuntimeStatus.RUNNING)
    engine.client.suspend(instance, "maintenance")
    wait_status(engine, instance, RuntimeStatus.SUSPENDED)
    engine.client.raise_event(instance, "go", "while suspended")
    # the event is journaled while suspended, but the code does not run
    events = wait_history(engine, instance, lambda evs: bodies(evs, EventRaised))
    assert not bodies(events, ExecutionCompleted)
    assert engine.client.get(instance).status is RuntimeStatus.SUSPENDED
    engine.client.resume(instance, "done")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output["got"] == "while suspended"
    kinds = [type(e.body) for e in engine.history(instance)]
    assert kinds.index(ExecutionSuspended) < kinds.index(EventRaised)
    assert kinds.index(EventRaised) < kinds.index(ExecutionResumed)
    assert kinds.index(ExecutionResumed) < kinds.index(ExecutionCompleted)


def test_purge_removes_a_completed_instance(engine: RunningEngine) -> None:
    instance = engine.client.start("t.echo", "bye")
    assert engine.client.wait_for_completion(instance, WAIT).output == "bye"
    engine.client.purge(instance)
    wait_until(lambda: engine.client.get(instance) is None, WAIT, what="the purge")
    assert instance not in engine.final_statuses()
    # the audit log keeps the history of a purged instance
    assert bodies(engine.history(instance), ExecutionCompleted)
    # the id can be used again from scratch
    engine.client.start("t.echo", "again", instance_id=instance)
    assert engine.client.wait_for_completion(instance, WAIT).output == "again"


def test_purge_of_a_running_instance_is_refused(engine: RunningEngine) -> None:
    instance = engine.client.start("t.wait_event", {})
    wait_status(engine, instance, RuntimeStatus.RUNNING)
    with pytest.raises(InstanceStillRunningError):
        engine.client.purge(instance)
    # the purge and the event land on the same partition in this order: if the purge had
    # removed the instance, the event would wait for a start and nothing would complete
    engine.client.raise_event(instance, "go", "still here")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output["got"] == "still here"
    assert engine.client.get(instance) is not None


# --- continue-as-new, ID reuse, idempotency, scheduled start -------------------------------------


def test_continue_as_new_runs_several_generations(engine: RunningEngine) -> None:
    instance = engine.client.start("t.counter", {"n": 0, "acc": 0, "limit": 4})
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    # acc = 0 + 0 + 1 + 2 + 3
    assert state.output == {"n": 4, "acc": 6, "generation": 3}
    assert state.generation == 3
    events = engine.history(instance)
    assert [e.sequence for e in events] == list(range(len(events)))
    assert [e.generation for e in events if isinstance(e.body, ExecutionStarted)] == [0, 1, 2, 3]
    assert len(bodies(events, ContinuedAsNew)) == 3
    assert len(bodies(events, ExecutionCompleted)) == 1


def test_error_if_running_refuses_a_second_start(engine: RunningEngine) -> None:
    instance = new_id("reuse")
    engine.client.start("t.wait_event", {"n": 1}, instance_id=instance)
    wait_status(engine, instance, RuntimeStatus.RUNNING)
    with pytest.raises(WorkflowAlreadyRunningError):
        engine.client.start(
            "t.wait_event",
            {"n": 2},
            instance_id=instance,
            reuse_policy=IdReusePolicy.ERROR_IF_RUNNING,
        )
    engine.client.raise_event(instance, "go", "x")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.output == {"input": {"n": 1}, "got": "x"}
    assert state.generation == 0
    assert len(bodies(engine.history(instance), ExecutionStarted)) == 1


def test_ignore_if_running_keeps_the_running_instance(engine: RunningEngine) -> None:
    instance = new_id("reuse")
    engine.client.start("t.wait_event", {"n": 1}, instance_id=instance)
    wait_status(engine, instance, RuntimeStatus.RUNNING)
    engine.client.start(
        "t.wait_event", {"n": 2}, instance_id=instance, reuse_policy=IdReusePolicy.IGNORE_IF_RUNNING
    )
    engine.client.raise_event(instance, "go", "y")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.output == {"input": {"n": 1}, "got": "y"}
    assert len(bodies(engine.history(instance), ExecutionStarted)) == 1


def test_terminate_if_running_restarts_the_instance(engine: RunningEngine) -> None:
    instance = new_id("reuse")
    engine.client.start("t.wait_event", {"n": 1}, instance_id=instance)
    wait_status(engine, instance, RuntimeStatus.RUNNING)
    engine.client.start(
        "t.wait_event",
        {"n": 2},
        instance_id=instance,
        reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING,
    )
    engine.client.raise_event(instance, "go", "z")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED
    assert state.output == {"input": {"n": 2}, "got": "z"}
    assert state.generation == 1
    events = engine.history(instance)
    assert [e.sequence for e in events] == list(range(len(events)))
    ends = [(e.generation, e.body.status) for e in events if isinstance(e.body, ExecutionCompleted)]
    assert ends == [(0, RuntimeStatus.TERMINATED), (1, RuntimeStatus.COMPLETED)]


def test_a_completed_instance_restarts_as_a_new_generation(engine: RunningEngine) -> None:
    instance = new_id("rerun")
    engine.client.start("t.echo", "first", instance_id=instance)
    first = engine.client.wait_for_completion(instance, WAIT)
    assert (first.output, first.generation) == ("first", 0)
    engine.client.start("t.echo", "second", instance_id=instance)
    second = wait_until(
        lambda: (
            (s := engine.client.get(instance)) is not None
            and s.generation == 1
            and s.is_completed
            and s
        ),
        WAIT,
        what="the second run",
    )
    assert second.output == "second"
    events = engine.history(instance)
    assert [e.generation for e in events if isinstance(e.body, ExecutionStarted)] == [0, 1]
    assert [e.sequence for e in events] == list(range(len(events)))


def test_the_same_start_command_twice_runs_once(engine: RunningEngine) -> None:
    instance = new_id("idem")
    command = StartWorkflow(
        instance_id=instance, name="t.echo", input=to_payload("once"), request_id="request-1"
    )
    engine.send_command(command)
    engine.send_command(command)
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.output == "once"
    # a marker on the same partition, sent after both: once it completed, both were handled
    marker = same_partition_id(instance, "marker")
    engine.client.start("t.echo", "m", instance_id=marker)
    engine.client.wait_for_completion(marker, WAIT)
    events = engine.history(instance)
    assert len(bodies(events, ExecutionStarted)) == 1
    assert len(bodies(events, ExecutionCompleted)) == 1
    assert engine.client.get(instance).generation == 0


def test_a_scheduled_start_waits_pending_until_its_time(engine: RunningEngine) -> None:
    start_at = datetime.now(UTC) + timedelta(seconds=2)
    instance = engine.client.start("t.echo", "later", start_at=start_at)
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.output == "later"
    statuses = [s.status for s in engine.status_records(instance) if s is not None]
    assert statuses[0] is RuntimeStatus.PENDING
    assert statuses[-1] is RuntimeStatus.COMPLETED
    [started] = [e for e in engine.history(instance) if isinstance(e.body, ExecutionStarted)]
    assert started.timestamp_ms >= int(start_at.timestamp() * 1000)
    assert started.body.scheduled_start_ms == int(start_at.timestamp() * 1000)


# --- failures -----------------------------------------------------------------------------------


def test_activity_retries_are_durable_timers(engine: RunningEngine) -> None:
    instance = engine.client.start("t.flaky", 2)
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output == 3, "the third attempt succeeded"
    events = engine.history(instance)
    assert [b.attempt for b in bodies(events, TaskScheduled)] == [1, 2, 3]
    assert [b.attempt for b in bodies(events, TaskFailed)] == [1, 2]
    assert [b.attempt for b in bodies(events, TaskCompleted)] == [3]
    assert len(bodies(events, TimerCreated)) == 2, "one backoff timer per retry"
    assert len(bodies(events, TimerFired)) == 2
    kinds = [type(e.body).__name__ for e in events if type(e.body).__name__ != "TurnStarted"]
    first_failure = kinds.index("TaskFailed")
    assert kinds[first_failure + 1 : first_failure + 2] == ["TimerCreated"]


def test_a_non_retryable_activity_failure_fails_the_workflow_with_details(
    engine: RunningEngine,
) -> None:
    instance = engine.client.start("t.declined", "insufficient funds")
    state = engine.client.wait_for_completion(instance, WAIT)
    assert state.status is RuntimeStatus.FAILED
    failure = state.failure
    assert failure is not None
    chain = failure.chain()
    assert any(f.type == "CardDeclined" for f in chain), chain
    declined = next(f for f in chain if f.type == "CardDeclined")
    assert declined.message == "card declined: insufficient funds"
    assert "decline" in declined.stack and "Traceback" in declined.stack
    assert not declined.retryable
    assert len(bodies(engine.history(instance), TaskScheduled)) == 1, "no retry"


def test_a_child_failure_propagates_to_the_parent(engine: RunningEngine) -> None:
    parent = new_id("parent")
    engine.client.start("t.parent_of_failing", 13, instance_id=parent)
    child = engine.client.wait_for_completion(f"{parent}:child", WAIT)
    assert child.status is RuntimeStatus.FAILED
    assert child.failure is not None and child.failure.type == "BadInputError"
    state = engine.client.wait_for_completion(parent, WAIT)
    assert state.status is RuntimeStatus.FAILED
    assert state.failure is not None
    types = [f.type for f in state.failure.chain()]
    assert "ChildWorkflowFailedError" in types, types
    assert "cannot handle 13" in str([f.message for f in state.failure.chain()])


def same_partition_id(other: str, prefix: str) -> str:
    target = murmur2_partition(other.encode(), PARTITIONS)
    while True:
        candidate = new_id(prefix)
        if murmur2_partition(candidate.encode(), PARTITIONS) == target:
            return candidate


def test_a_failing_workflow_fails_alone(engine: RunningEngine) -> None:
    failing = new_id("failing")
    neighbours = [same_partition_id(failing, "neighbour") for _ in range(20)]
    for i, neighbour in enumerate(neighbours[:10]):
        engine.client.start("t.echo", i, instance_id=neighbour, flush=False)
    engine.client.start("t.raises", "poison", instance_id=failing, flush=False)
    for i, neighbour in enumerate(neighbours[10:], start=10):
        engine.client.start("t.echo", i, instance_id=neighbour, flush=False)
    engine.client.flush()
    state = engine.client.wait_for_completion(failing, WAIT)
    assert state.status is RuntimeStatus.FAILED
    assert state.failure is not None
    assert state.failure.type == "BadInputError"
    assert state.failure.message == "cannot handle 'poison'"
    assert "raises" in state.failure.stack
    for i, neighbour in enumerate(neighbours):
        done = engine.client.wait_for_completion(neighbour, WAIT)
        assert (done.status, done.output) == (RuntimeStatus.COMPLETED, i)
