"""Per-key concurrency limits on starts: at most K running per (workflow, key), the rest
waiting in order as PENDING, a slot freed by every way a run ends (not by a continue-as-new),
and the queue kept across a restart. The pure admission logic has a Hypothesis test below;
the Kafka side is tests/integration/test_concurrency_limits_kafka.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import encode_message
from engine.core.concurrency import ConcurrencySlots, SlotHolder, acquire, release, slots_id
from engine.core.errors import NoConcurrencyLimitError, RegistrationError
from engine.core.history import RuntimeStatus
from engine.core.messages import CommandResult, ConcurrencySlot, SlotOp
from engine.services.client.commands import start_command
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import PartitionProcessor
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="sync-account", max_concurrency_per_key=2, failure_types=(ValueError,))
async def sync_account(ctx: WorkflowContext, account: str) -> str:
    outcome = await ctx.wait_for_event("go")
    if outcome == "fail":
        raise ValueError("sync failed")
    if outcome == "again":
        ctx.continue_as_new(account)
    return f"synced {account}"


@registry.workflow(name="unlimited")
async def unlimited(ctx: WorkflowContext) -> str:
    return "ran"


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=3) as engine:
        yield engine


def _status(env: TestEngine, instance_id: str) -> RuntimeStatus:
    state = env.get(instance_id)
    assert state is not None
    return state.status


def _running(env: TestEngine, ids: list[str]) -> list[str]:
    return [i for i in ids if _status(env, i) is RuntimeStatus.RUNNING]


def _start(env: TestEngine, ids: list[str], key: str = "acct-1") -> None:
    for i in ids:
        env.start("sync-account", key, instance_id=i, concurrency_key=key)
    env.run()


def test_at_most_k_run_and_the_rest_wait_in_order(env: TestEngine) -> None:
    ids = [f"s{n}" for n in range(5)]
    _start(env, ids)
    assert _running(env, ids) == ["s0", "s1"]
    waiting = env.get("s2")
    assert waiting is not None and waiting.status is RuntimeStatus.PENDING
    assert "waits for a slot" in waiting.pending_reason
    order = []
    for _ in range(3):
        first = _running(env, ids)[0]
        env.raise_event(first, "go", "ok")
        env.run()
        order.append(_running(env, ids)[-1])
        assert len(_running(env, ids)) == 2
    assert order == ["s2", "s3", "s4"]


def test_another_key_has_its_own_slots(env: TestEngine) -> None:
    _start(env, ["a0", "a1", "a2"], key="acct-a")
    _start(env, ["b0", "b1"], key="acct-b")
    assert _running(env, ["a0", "a1", "a2"]) == ["a0", "a1"]
    assert _running(env, ["b0", "b1"]) == ["b0", "b1"]


def test_the_answer_says_the_start_waits(env: TestEngine) -> None:
    answer = env.client.send(
        start_command(
            env.client.registry, "sync-account", "x", instance_id="w2", concurrency_key="k"
        ),
        wait=True,
    )
    assert answer is not None and answer.result is CommandResult.BUFFERED
    assert "waits as PENDING for a slot" in answer.reason


@pytest.mark.parametrize("how", ["complete", "fail", "terminate"])
def test_a_run_that_ends_frees_its_slot(env: TestEngine, how: str) -> None:
    ids = ["e0", "e1", "e2"]
    _start(env, ids)
    assert _status(env, "e2") is RuntimeStatus.PENDING
    if how == "terminate":
        env.terminate("e0", "stop")
    else:
        env.raise_event("e0", "go", "ok" if how == "complete" else "fail")
    env.run()
    ended = {"complete": RuntimeStatus.COMPLETED, "fail": RuntimeStatus.FAILED}
    assert _status(env, "e0") is ended.get(how, RuntimeStatus.TERMINATED)
    assert _running(env, ids) == ["e1", "e2"]


def test_a_continue_as_new_keeps_its_slot(env: TestEngine) -> None:
    ids = ["c0", "c1", "c2"]
    _start(env, ids)
    env.raise_event("c0", "go", "again")
    env.run()
    state = env.get("c0")
    assert state is not None and state.generation == 1
    assert _running(env, ids) == ["c0", "c1"]
    assert _status(env, "c2") is RuntimeStatus.PENDING


def test_a_waiting_start_that_is_terminated_leaves_the_queue(env: TestEngine) -> None:
    ids = ["t0", "t1", "t2", "t3"]
    _start(env, ids)
    env.terminate("t2", "not needed")
    env.run()
    env.raise_event("t0", "go", "ok")
    env.run()
    assert _status(env, "t2") is RuntimeStatus.TERMINATED
    assert _running(env, ids) == ["t1", "t3"]


def test_the_queue_survives_a_restart(env: TestEngine) -> None:
    ids = ["r0", "r1", "r2", "r3"]
    _start(env, ids)
    env.deploy(registry)  # the processors forget their hot rows: they are reloaded
    env.raise_event("r0", "go", "ok")
    env.raise_event("r1", "go", "ok")
    env.run()
    assert _running(env, ids) == ["r2", "r3"]
    for i in ("r2", "r3"):
        env.raise_event(i, "go", "ok")
        assert env.wait_for_completion(i).output == "synced acct-1"


def _rebuild_from_changelogs(env: TestEngine) -> None:
    """Every partition's store rebuilt from its changelog topics alone, as a takeover by
    another replica would (compacted: the last value of each key wins)."""
    stores: dict[int, MemoryPartitionStore] = {p: MemoryPartitionStore() for p in env.processors}
    for topic in ("state-changelog", "timer-changelog"):
        for record in env.records(topic):
            assert record.key is not None
            stores[record.partition].write({record.key: record.value})
    for p, old in list(env.processors.items()):
        env.processors[p] = PartitionProcessor(p, stores[p], old.env)


def test_the_queue_survives_a_takeover_rebuilt_from_the_changelog(env: TestEngine) -> None:
    ids = ["k0", "k1", "k2", "k3", "k4"]
    _start(env, ids)
    _rebuild_from_changelogs(env)
    assert _running(env, ids) == ["k0", "k1"]
    env.raise_event("k1", "go", "ok")
    env.run()
    assert _running(env, ids) == ["k0", "k2"]
    env.terminate("k0", "stop")
    env.run()
    assert _running(env, ids) == ["k2", "k3"]


def test_every_start_completes_in_the_end(env: TestEngine) -> None:
    ids = [f"all{n}" for n in range(6)]
    _start(env, ids)
    done = 0
    while done < len(ids):
        running = _running(env, ids)
        assert 1 <= len(running) <= 2
        for i in running:
            env.raise_event(i, "go", "ok")
            done += 1
        env.run()
    assert all(_status(env, i) is RuntimeStatus.COMPLETED for i in ids)


def test_a_scheduled_start_asks_for_its_slot_when_its_time_comes(env: TestEngine) -> None:
    _start(env, ["p0", "p1"])
    later = env.now() + timedelta(minutes=5)
    env.start("sync-account", "acct-1", instance_id="p2", concurrency_key="acct-1", start_at=later)
    env.run()
    scheduled = env.get("p2")
    assert scheduled is not None and scheduled.pending_reason == ""  # waits for its time
    env.advance(timedelta(minutes=6))
    waiting = env.get("p2")
    assert waiting is not None and "waits for a slot" in waiting.pending_reason
    env.raise_event("p0", "go", "ok")
    env.run()
    assert _running(env, ["p0", "p1", "p2"]) == ["p1", "p2"]


def test_a_key_for_a_workflow_without_a_limit_is_refused(env: TestEngine) -> None:
    with pytest.raises(NoConcurrencyLimitError, match="max_concurrency_per_key"):
        env.start("unlimited", None, instance_id="u", concurrency_key="k")


def test_the_reserved_ids_are_refused(env: TestEngine) -> None:
    with pytest.raises(NoConcurrencyLimitError, match="reserved"):
        env.start("unlimited", None, instance_id=slots_id("sync-account", "k"))


def test_an_acquire_for_an_ordinary_instance_goes_to_dead_letters(env: TestEngine) -> None:
    forged = ConcurrencySlot(instance_id="plain", op=SlotOp.ACQUIRE, holder="x", limit=1)
    env.produce(env.topics.instance_messages, b"plain", encode_message(forged))
    env.run()
    [letter] = env.dead_letters()
    assert "not a slots row" in letter.reason
    assert env.get("plain") is None


def test_a_bad_limit_is_a_registration_error() -> None:
    with pytest.raises(RegistrationError, match="whole number"):
        Registry().add_workflow(sync_account, name="bad", max_concurrency_per_key=-1)


# --- the admission logic -------------------------------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["acquire", "release"]), st.integers(0, 7)), max_size=60)


@given(ops, st.integers(1, 3))
def test_admission_keeps_the_limit_and_the_order(script: list[tuple[str, int]], k: int) -> None:
    slots = ConcurrencySlots()
    asked: list[str] = []  # ids in the order they first asked (and are not yet released)
    granted: list[str] = []
    for op, n in script:
        holder = f"i{n}"
        if op == "acquire":
            if holder not in asked:
                asked.append(holder)
            got = acquire(slots, SlotHolder(holder, 0), k)
        else:
            if holder in asked:
                asked.remove(holder)
            got = release(slots, holder)
        granted += [g.instance_id for g in got if g.instance_id not in granted]
        running = [h.instance_id for h in slots.running]
        waiting = [h.instance_id for h in slots.waiting]
        assert len(running) <= k
        assert len(set(running + waiting)) == len(running) + len(waiting)
        assert running + waiting == [a for a in asked if a in running] + [
            a for a in asked if a in waiting
        ]
        assert not waiting or len(running) == k  # nobody waits while a slot is free
        assert sorted(running + waiting) == sorted(asked)
        # whoever runs was granted; the waiting start nearer the front asked earlier
        assert set(running) <= set(granted)
        assert waiting == [a for a in asked if a in waiting]
        granted = [g for g in granted if g in running]
