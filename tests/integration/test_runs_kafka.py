"""Long lives of an instance id on a real broker: a parent purged and started again under
the same id gets its activity and child results (run ids travel through the worker and
the child), and continue-as-new drains a backlog of events through the processor's
wake-up timer, with history linear in the backlog."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from engine_harness import RunningEngine, running_engine, wait_until

from engine.codec import decode_message
from engine.core.history import ContinuedAsNew, ExecutionStarted, RuntimeStatus
from engine.core.messages import ActivityResult, ActivityTask, DeadLetter

pytestmark = pytest.mark.kafka

WAIT = 120.0


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def test_a_parent_purged_and_started_again_gets_its_results(engine: RunningEngine) -> None:
    parent = f"runs-{uuid.uuid4().hex[:10]}"
    first = engine.client.start("t.child_and_activity", 1, instance_id=parent)
    assert engine.wait_for_completion(first, WAIT).output == {
        "total": 2,
        "child": {"from": parent, "x": 1},
    }
    engine.client.purge(parent)
    wait_until(lambda: engine.client.get(parent) is None, WAIT, what="the purge")
    engine.client.start("t.child_and_activity", 5, instance_id=parent)
    state = engine.wait_for_completion(parent, WAIT)
    assert state.status is RuntimeStatus.COMPLETED, state.failure
    assert state.output == {"total": 6, "child": {"from": parent, "x": 5}}
    runs = [e.body.run_id for e in engine.history(parent) if isinstance(e.body, ExecutionStarted)]
    assert len(runs) == 2 and runs[0] != runs[1] and state.run_id == runs[1]
    # the worker answered each run's attempt under that run's id
    tasks = [decode_message(r.value) for r in engine.read(engine.topics.activity_tasks) if r.value]
    keys = {
        t.idempotency_key for t in tasks if isinstance(t, ActivityTask) and t.instance_id == parent
    }
    assert keys == {f"{parent}/{run}/0/0" for run in runs}
    results = [
        decode_message(r.value) for r in engine.read(engine.topics.activity_results) if r.value
    ]
    assert sorted(
        r.run_id for r in results if isinstance(r, ActivityResult) and r.instance_id == parent
    ) == sorted(runs)


def test_continue_as_new_drains_a_backlog(engine: RunningEngine) -> None:
    instance = f"drain-{uuid.uuid4().hex[:10]}"
    total, per = 400, 10
    state = {"count": 0, "total": total, "per": per, "ordered": True}
    for value in range(total):  # queued before the start: its first turn is given them all
        engine.client.raise_event(instance, "e", value, wait=False)
    engine.client.start("t.drain", state, instance_id=instance)
    done = engine.wait_for_completion(instance, WAIT)
    assert done.status is RuntimeStatus.COMPLETED, done.failure
    assert done.output == {**state, "count": total}
    assert done.generation == total // per - 1
    history = engine.history(instance)
    assert sum(isinstance(e.body, ContinuedAsNew) for e in history) == total // per - 1
    assert len(history) < 6 * total  # linear in the backlog, however the batches fell
    letters = [decode_message(r.value) for r in engine.read(engine.topics.dead_letters) if r.value]
    assert not [d for d in letters if isinstance(d, DeadLetter) and d.instance_id == instance]
