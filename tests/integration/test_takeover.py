"""Takeover: a replica dies (SIGKILL) and a replica that never ran before - another replica
id, an empty state folder - takes over its partitions, rebuilds the instance and timer
tables from the changelogs, and the workflows that were waiting complete, nothing lost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from engine_harness import EngineProcess, history_problems, running_engine, wait_until

from engine.core.history import (
    EventRaised,
    ExecutionStarted,
    RuntimeStatus,
    TimerCreated,
    TimerFired,
)

pytestmark = pytest.mark.kafka

PARTITIONS = 8
WAITING = 20
SLEEPING = 20
ORDERS = 4


def test_a_fresh_replica_takes_over_and_nothing_is_lost(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, in_process=False, state_dir=tmp_path
    ) as engine:
        client = engine.client
        old = engine.processors["processor-0"]
        assert isinstance(old, EngineProcess)

        done_before = [client.start("chain3.activities", i, flush=False) for i in range(10)]
        waiting = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(WAITING)]
        sleeping = [
            client.start("t.timer_then_activity", {"sleep": 6.0, "x": i}, flush=False)
            for i in range(SLEEPING)
        ]
        orders = [f"takeover-order-{i}" for i in range(ORDERS)]
        for order in orders:
            client.start("orders.order", {"order_id": order, "amount": 10}, instance_id=order)
        client.flush()
        for i, instance in enumerate(done_before):
            assert engine.wait_for_completion(instance, 60).output == i + 3
        for order in orders:
            wait_until(
                lambda o=order: (
                    (s := client.get(o)) is not None and s.custom_status == "awaiting approval"
                ),
                60,
                what=f"{order} to wait for approval",
            )
        for instance in waiting:
            wait_until(
                lambda i=instance: (
                    (s := client.get(i)) is not None and s.status is RuntimeStatus.RUNNING
                ),
                60,
                what=f"{instance} to run",
            )
        # every timer is committed (in history, hence in the timer changelog) and not fired
        histories = wait_until(
            lambda: (
                (h := engine.histories())
                and all(
                    any(isinstance(e.body, TimerCreated) for e in h.get(i, [])) for i in sleeping
                )
                and h
            ),
            60,
            what="the timers to be created",
        )
        assert not any(isinstance(e.body, TimerFired) for i in sleeping for e in histories[i])

        old.kill()  # nothing answers commands until the new replica took over: only write
        for i, instance in enumerate(waiting):
            client.raise_event(instance, "go", {"after": i}, wait=False)
        for order in orders:
            client.raise_event(order, "approval", {"approved": True}, wait=False)
        client.flush()
        new = engine.start_processor("processor-1")
        assert isinstance(new, EngineProcess)

        for i, instance in enumerate(waiting):
            state = engine.wait_for_completion(instance, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output == {"input": {"n": i}, "got": {"after": i}}
        for i, instance in enumerate(sleeping):
            state = engine.wait_for_completion(instance, 120)
            assert (state.status, state.output) == (RuntimeStatus.COMPLETED, i + 1)
        for order in orders:
            state = engine.wait_for_completion(order, 120)
            assert state.status is RuntimeStatus.COMPLETED, state.failure
            assert state.output["status"] == "shipped"
            assert state.output["tracking"] == f"tracking-parcel-{order}"

        log = new.current_log()
        restored = [line for line in log.splitlines() if " restored: " in line]
        owned = {
            int(p)
            for line in restored
            for p in re.findall(r"\d+", line.split("[")[1].split("]")[0])
        }
        assert owned == set(range(PARTITIONS)), log[-3000:]
        assert any(" restored: 0 " not in line for line in restored), "state came from changelogs"
        assert not old.alive and new.alive

        records = engine.history_records()
        problems = []
        for instance in [*done_before, *waiting, *sleeping, *orders]:
            problems += history_problems(instance, records[instance])
            events = [e for _, e in records[instance]]
            assert sum(isinstance(e.body, ExecutionStarted) for e in events) == 1
        assert not problems, "\n".join(problems[:20])
        for instance in waiting:
            raised = [e.body for _, e in records[instance] if isinstance(e.body, EventRaised)]
            assert len(raised) == 1, "the event raised after the kill was applied once"
        for instance in sleeping:
            fired = [e for _, e in records[instance] if isinstance(e.body, TimerFired)]
            assert len(fired) == 1
        assert not engine.dead_letters()


def test_a_paused_replica_that_comes_back_cannot_commit_stale_work(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A replica frozen mid-work (SIGSTOP) loses its partitions to another replica; when it
    wakes up (SIGCONT) its open transaction and stale state must not leak into the output:
    every workflow still completes exactly once, and the zombie rejoins as a healthy member."""
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, in_process=False, state_dir=tmp_path
    ) as engine:
        client = engine.client
        zombie = engine.processors["processor-0"]
        assert isinstance(zombie, EngineProcess)
        zombie.wait_for_log(" restored: ")
        expected: dict[str, object] = {}
        waiting = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(10)]
        for instance in waiting:
            expected[instance] = None
        for i in range(100):
            expected[client.start("chain3.activities", i, flush=False)] = i + 3
        client.flush()
        for instance in waiting:
            wait_until(
                lambda i=instance: client.get(i) is not None,
                60,
                what=f"{instance} to start",
            )
        # freeze it while it is busy with the next burst
        for i in range(100, 200):
            expected[client.start("chain3.activities", i, flush=False)] = i + 3
        client.flush()
        zombie.pause()
        frozen_log = len(zombie.current_log())
        try:
            for i, instance in enumerate(waiting):  # the owner is frozen: only write
                client.raise_event(instance, "go", i, wait=False)
                expected[instance] = {"input": {"n": i}, "got": i}
            other = engine.start_processor("processor-1")
            assert isinstance(other, EngineProcess)
            for instance, output in expected.items():
                state = engine.wait_for_completion(instance, 120)
                assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
                assert state.output == output
        finally:
            zombie.resume()
        # The zombie wakes up and finds its partitions gone and its transaction aborted by
        # the broker (which bumps its producer epoch: librdkafka reports that as fenced).
        # It either recovers and rejoins, or stops on the fencing error, in which case it
        # is restarted with the same id and state, as its supervisor would.
        woke = wait_until(
            lambda: (
                (not zombie.alive and "stopped")
                or (" restored: " in zombie.current_log()[frozen_log:] and "rejoined")
            ),
            120,
            what="the zombie to rejoin the group or stop",
        )
        if woke == "stopped":
            log = zombie.current_log()
            assert zombie.returncode != 0 and "fenced" in log.lower(), log[-3000:]
            zombie.start()
            zombie.wait_for_log(" restored: ")
        late = {client.start("chain3.activities", i, flush=False): i + 3 for i in range(50)}
        client.flush()
        for instance, output in late.items():
            state = engine.wait_for_completion(instance, 120)
            assert (state.status, state.output) == (RuntimeStatus.COMPLETED, output)
        expected.update(late)
        assert zombie.alive and other.alive, engine.logs()

        records = engine.history_records()
        problems = []
        for instance in expected:
            problems += history_problems(instance, records[instance])
        assert not problems, "\n".join(problems[:20])
        assert set(records) == set(expected)
        statuses = engine.final_statuses()
        assert all(statuses[i].status is RuntimeStatus.COMPLETED for i in expected)
        assert not engine.dead_letters()
