"""Updates in the pure runtime: a validator's rejection writes nothing, an accepted update
is journaled and its handler runs as a fiber that may await activities and timers, a
retry with the same update id is refused (the first answer stands), and replay decides the
same from the recorded updates."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_harness import Sim

from engine import Registry, WorkflowContext
from engine.core.failure import FailureDetails
from engine.core.history import (
    ContinuedAsNew,
    EventBody,
    EventRaised,
    ExecutionCancelRequested,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    HistoryEvent,
    Inbound,
    RuntimeStatus,
    UpdateAccepted,
    UpdateCompleted,
    UpdatesCarried,
)
from engine.core.payloads import from_payload, to_payload
from engine.runtime import WorkflowExecution
from engine.runtime.actions import TurnResult
from engine.runtime.continuation import (
    UPDATE_RESULTS_CARRIED_BYTES,
    UPDATES_CARRIED,
    carried_updates,
)
from engine.runtime.updates import update_names

reg = Registry()


@reg.activity
def double(n: int) -> int:
    return 2 * n


@reg.workflow
async def counter(ctx: WorkflowContext, _: Any) -> int:
    total = {"value": 0}

    def positive(n: int) -> None:
        if n <= 0:
            raise ValueError(f"{n} is not positive")

    async def add(n: int) -> int:
        doubled: int = await ctx.call_activity(double, n)
        await ctx.sleep(1)
        total["value"] += doubled
        return total["value"]

    def fail() -> None:
        raise RuntimeError("no")

    def peek_then_sleep(_: Any) -> None:
        ctx.sleep(5)  # a validator may not decide anything

    ctx.set_update_handler("add", add, validator=positive)
    ctx.set_update_handler("fail", fail)
    ctx.set_update_handler("sneaky", lambda n: n, validator=peek_then_sleep)
    ctx.set_query_handler("total", lambda: total["value"])
    await ctx.wait_for_event("stop")
    return total["value"]


def _update(sim: Sim, update_id: str, name: str, arg: Any = None) -> None:
    payload = None if arg is None else to_payload(arg)
    sim.send("wf-1", UpdateAccepted(update_id, name, payload))


def _completed(sim: Sim) -> dict[str, Any]:
    done: list[UpdateCompleted] = sim.bodies(UpdateCompleted)
    return {
        d.update_id: from_payload(d.output) if d.failure is None else d.failure.message
        for d in done
    }


@pytest.mark.parametrize("cold", [False, True])
def test_an_accepted_update_runs_as_a_fiber_and_its_result_is_recorded(cold: bool) -> None:
    sim = Sim(reg, cold=cold)
    sim.start("counter")
    sim.run()
    _update(sim, "u1", "add", 3)
    _update(sim, "u2", "add", 4)
    sim.run()
    assert _completed(sim) == {"u1": 6, "u2": 14}
    assert [b.update_id for b in sim.bodies(UpdateAccepted)] == ["u1", "u2"]
    sim.raise_event("wf-1", "stop")
    sim.run()
    assert sim.status() is RuntimeStatus.COMPLETED and sim.output() == 14
    replayed = WorkflowExecution(reg, "wf-1")
    replayed.replay(sim.history())  # deterministic: the recorded updates start the same fibers
    assert replayed.status is RuntimeStatus.COMPLETED


def test_a_rejected_update_writes_no_history_and_says_why() -> None:
    sim = Sim(reg)
    sim.start("counter")
    sim.run()
    before = len(sim.history())
    _update(sim, "u1", "add", -1)
    _update(sim, "u2", "nope", 1)
    _update(sim, "u3", "sneaky", 1)
    sim.run()
    assert len(sim.history()) == before
    reasons = [r.reason for r in sim.rejected()]
    assert "rejected by its validator: -1 is not positive" in reasons[0]
    assert "its updates: 'add', 'fail', 'sneaky'" in reasons[1]
    assert "read-only" in reasons[2]
    assert update_names(sim.execution().current_generation) == ["add", "fail", "sneaky"]


def test_a_retry_with_the_same_update_id_is_refused_and_the_first_result_stands() -> None:
    sim = Sim(reg)
    sim.start("counter")
    sim.run()
    _update(sim, "u1", "add", 1)
    sim.run()
    _update(sim, "u1", "add", 1)
    sim.run()
    assert _completed(sim) == {"u1": 2}
    assert "already accepted" in sim.rejected()[0].reason
    gen = sim.execution().current_generation
    assert gen is not None
    first = gen.update_ids["u1"]
    assert first is not None and from_payload(first.output) == 2


def test_a_handler_that_raises_completes_the_update_with_its_failure() -> None:
    sim = Sim(reg)
    sim.start("counter")
    sim.run()
    _update(sim, "u1", "fail")
    sim.run()
    assert _completed(sim) == {"u1": "no"}
    assert sim.status() is RuntimeStatus.RUNNING  # the instance itself goes on


def test_suspended_and_ended_instances_refuse_updates() -> None:
    sim = Sim(reg)
    sim.start("counter")
    sim.run()
    sim.send("wf-1", ExecutionSuspended("hold"))
    sim.run()
    _update(sim, "u1", "add", 1)
    sim.run()
    sim.send("wf-1", ExecutionResumed())
    sim.raise_event("wf-1", "stop")
    sim.run()
    _update(sim, "u2", "add", 1)
    sim.run()
    reasons = [r.reason for r in sim.rejected()]
    assert "suspended" in reasons[0] and "has ended (COMPLETED)" in reasons[1]
    assert not sim.bodies(UpdateAccepted)


# --- interleaving updates, events, cancels and continue-as-new -----------------------------


@reg.workflow
async def rounds(ctx: WorkflowContext, state: dict[str, Any]) -> int:
    """Adds what updates bring; an event "next" continues as new once no update runs. A
    first cancellation request continues as new too (once its updates have finished), a
    later one, in another generation, ends the instance CANCELLED."""
    total: dict[str, int] = {"value": state["total"]}

    async def add(n: int) -> int:
        total["value"] += await ctx.call_activity(double, n)
        await ctx.sleep(n % 3)
        return total["value"]

    ctx.set_update_handler("add", add, validator=lambda n: None if n >= 0 else 1 / 0)
    try:
        command = await ctx.wait_for_event("command")
        await ctx.wait_condition(ctx.all_updates_finished)
    except asyncio.CancelledError:
        await ctx.wait_condition(ctx.all_updates_finished)  # those accepted after it
        if state.get("cancelled"):
            raise
        ctx.continue_as_new({"total": total["value"], "cancelled": True})
    if command == "stop":
        return total["value"]
    ctx.continue_as_new({**state, "total": total["value"]})


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.sampled_from(["a", "b", "c", "d"]), st.integers(-1, 5)),
        st.tuples(st.just("next"), st.none(), st.none()),
        st.tuples(st.just("cancel"), st.none(), st.none()),
        st.tuples(st.just("run"), st.none(), st.none()),
    ),
    max_size=25,
)


ROUNDS = 1_000
"""A bound on each run of the simulation in the interleaving test (a few dozen rounds
settle any of its examples): a turn loop that never ends fails that example at once
("the simulation did not settle") instead of running a million cold turns."""


def _play(sim: Sim, ops: list[tuple[str, Any, Any]]) -> None:
    for op, update_id, n in ops:
        if op == "update":
            _update(sim, update_id, "add", n)  # an id may come again: a client's retry
        elif op == "next":
            sim.raise_event("wf-1", "command", "next")
        elif op == "cancel":
            sim.send("wf-1", ExecutionCancelRequested("hypothesis", every_fiber=True))
        else:
            sim.run(max_rounds=ROUNDS)


def _updates_by_generation(sim: Sim) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per update id, the generations that accepted it and those that completed it."""
    accepted: dict[str, list[int]] = {}
    completed: dict[str, list[int]] = {}
    for event in sim.history():
        body = event.body
        if type(body) is UpdateAccepted:
            accepted.setdefault(body.update_id, []).append(event.generation)
            assert from_payload(body.input) >= 0  # the validator let no negative one in
        elif type(body) is UpdateCompleted:
            completed.setdefault(body.update_id, []).append(event.generation)
    return accepted, completed


def _answer(done: UpdateCompleted) -> tuple[Any, ...]:
    """What a retry is answered with (a carried failure has no stack)."""
    failure = done.failure
    return (done.output, None if failure is None else (failure.type, failure.message))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.booleans(), st.randoms(use_true_random=False))
def test_every_accepted_update_completes_exactly_once_or_is_still_pending(
    ops: list[tuple[str, Any, Any]], cold: bool, rng: random.Random
) -> None:
    """Updates (ids sent again: retries, also across generations), events that continue
    as new, cancellation requests and turns, interleaved in any order and batching: an
    update id is accepted once in the whole run (a retry after a continue-as-new finds
    the carried result) and completes once, in the generation that accepted it, or is
    still pending there; the carried result is the recorded one; replay agrees."""
    _check_every_update_once(ops, cold, rng)


def _check_every_update_once(
    ops: list[tuple[str, Any, Any]], cold: bool, rng: random.Random
) -> None:
    sim = Sim(reg, cold=cold, rng=rng, max_batch=3)
    sim.start("rounds", {"total": 0})
    _play(sim, ops)
    sim.run(timers=False, max_rounds=ROUNDS)
    accepted, completed = _updates_by_generation(sim)
    assert all(len(gens) == 1 for gens in accepted.values())  # de-duplicated by update id
    assert all(completed.get(uid, gens) == gens for uid, gens in accepted.items())
    assert set(completed) <= set(accepted)
    execution = sim.execution()
    gen = execution.current_generation
    assert gen is not None
    pending = {uid for uid, done in gen.update_ids.items() if done is None}
    assert set(accepted) == set(completed) | pending
    assert all(accepted[uid] == [gen.number] for uid in pending)
    first = {b.update_id: _answer(b) for b in sim.bodies(UpdateCompleted)}
    assert {uid: _answer(d) for uid, d in gen.update_ids.items() if d is not None} == first
    sim.run(max_rounds=ROUNDS)  # with the timers: every pending update finishes
    if sim.status() is RuntimeStatus.RUNNING:
        sim.raise_event("wf-1", "command", "stop")
        sim.run(max_rounds=ROUNDS)
    assert sim.status() in (RuntimeStatus.COMPLETED, RuntimeStatus.CANCELLED)
    assert len(sim.bodies(UpdateCompleted)) == len(sim.bodies(UpdateAccepted))
    replayed = WorkflowExecution(reg, "wf-1")
    replayed.replay(sim.history())
    assert replayed.status is sim.status()


def test_a_falsifying_interleaving_found_by_hypothesis_replays_as_it_ran() -> None:
    """A refused update in the turn that begins a generation, then an event, then an
    accepted update: cold turns (replay every turn) decide as the live ones did."""
    ops: list[tuple[str, Any, Any]] = [
        ("run", None, None), ("update", "a", 4), ("cancel", None, None), ("next", None, None),
        ("update", "c", -1), ("next", None, None), ("update", "c", 3), ("update", "a", 4),
        ("cancel", None, None), ("update", "b", 1), ("run", None, None), ("update", "b", -1),
        ("run", None, None), ("update", "c", -1), ("next", None, None), ("update", "c", 4),
        ("run", None, None), ("cancel", None, None), ("next", None, None),
        ("cancel", None, None), ("update", "c", -1), ("run", None, None), ("next", None, None),
        ("run", None, None), ("update", "a", 1),
    ]  # fmt: skip
    _check_every_update_once(ops, True, random.Random(4))


def test_a_refused_update_leaves_no_trace_of_running_the_code_first() -> None:
    """The code of a generation begun in this turn runs before an update is offered; when
    the update is refused, history shows no such run, so the turn goes on as replay will
    see it: the event that follows is applied before the code runs again (at the next
    update), so the code continues as new and the next update finds the run ended."""
    live = WorkflowExecution(reg, "wf-1")
    history: list[HistoryEvent] = []

    def turn(*bodies: EventBody) -> TurnResult:
        result = live.step([Inbound(body) for body in bodies], 1_000)
        history.extend(result.new_events)
        return result

    turn(ExecutionStarted("rounds", to_payload({"total": 0})))
    turn(EventRaised("command", to_payload("next")))
    assert live.status is RuntimeStatus.CONTINUED_AS_NEW  # generation 1 begins next turn
    result = turn(
        UpdateAccepted("u1", "add", to_payload(-1)),  # refused by its validator
        EventRaised("command", to_payload("next")),
        UpdateAccepted("u2", "add", to_payload(3)),
    )
    reasons = [r.reason for r in result.rejected]
    assert "rejected by its validator" in reasons[0]
    assert reasons[1] == "the instance has ended (CONTINUED_AS_NEW)"
    assert [type(e.body) for e in result.new_events][-2:] == [EventRaised, ContinuedAsNew]
    replayed = WorkflowExecution(reg, "wf-1")
    replayed.replay(history)  # decides what the live turn decided
    assert replayed.generation == 1 and replayed.status is RuntimeStatus.CONTINUED_AS_NEW


@pytest.mark.parametrize("cold", [False, True])
def test_an_update_in_the_turn_that_begins_a_generation_reaches_its_handlers(cold: bool) -> None:
    """The generation a continue-as-new asked for begins in the same turn the update
    arrives: its code runs first (and sets the handlers), then the update is offered;
    replay runs the code at the same point."""
    sim = Sim(reg, cold=cold, max_batch=1)
    sim.start("rounds", {"total": 5})
    sim.run()
    sim.raise_event("wf-1", "command", "next")
    _update(sim, "u1", "add", 1)
    sim.run()
    assert not sim.rejected()
    accepted = [e for e in sim.history() if type(e.body) is UpdateAccepted]
    assert [e.generation for e in accepted] == [1]
    assert _completed(sim) == {"u1": 7}
    replayed = WorkflowExecution(reg, "wf-1")
    replayed.replay(sim.history())
    assert replayed.generation == 1 and replayed.status is RuntimeStatus.RUNNING


def test_an_update_sent_with_the_start_runs_after_the_code_set_its_handlers() -> None:
    sim = Sim(reg)
    sim.start("counter")
    _update(sim, "u1", "add", 2)
    sim.run()
    assert not sim.rejected() and _completed(sim) == {"u1": 4}
    assert sim.kinds()[:3] == ["TurnStarted", "ExecutionStarted", "UpdateAccepted"]


# --- update ids across continue-as-new ---------------------------------------------------


@pytest.mark.parametrize("cold", [False, True])
def test_a_retry_after_a_continue_as_new_is_answered_with_the_first_result(cold: bool) -> None:
    sim = Sim(reg, cold=cold)
    sim.start("rounds", {"total": 0})
    sim.run()
    _update(sim, "u1", "add", 2)
    sim.run()
    _update(sim, "u2", "add", 1)
    sim.run()
    assert _completed(sim) == {"u1": 4, "u2": 6}
    for _ in range(2):  # two continue-as-new: carried, then carried again
        sim.raise_event("wf-1", "command", "next")
        sim.run()
    _update(sim, "u1", "add", 2)  # a client's retry, two generations later
    sim.run()
    assert sim.execution().generation == 2
    assert "already accepted" in sim.rejected()[-1].reason
    assert len(sim.bodies(UpdateCompleted)) == 2  # the handler did not run again
    gen = sim.execution().current_generation
    assert gen is not None
    first = gen.update_ids["u1"]
    assert first is not None and from_payload(first.output) == 4
    carried = [(e.generation, e.body) for e in sim.history() if isinstance(e.body, UpdatesCarried)]
    assert [generation for generation, _ in carried] == [1, 2]
    assert [u.update_id for u in carried[-1][1].updates] == ["u1", "u2"]
    replayed = WorkflowExecution(reg, "wf-1")
    replayed.replay(sim.history())
    assert replayed.current_generation is not None
    assert replayed.current_generation.update_ids == gen.update_ids


def test_a_continue_as_new_carries_the_newest_updates_within_its_bounds() -> None:
    small = [UpdateCompleted(f"u{i}", to_payload(i)) for i in range(UPDATES_CARRIED + 5)]
    kept = carried_updates(small)
    assert [u.update_id for u in kept] == [f"u{i}" for i in range(5, UPDATES_CARRIED + 5)]
    big = UpdateCompleted("big", to_payload("x" * UPDATE_RESULTS_CARRIED_BYTES))
    failed = UpdateCompleted("failed", None, FailureDetails("ValueError", "no", "a stack"))
    kept = carried_updates([small[0], big, failed])
    assert [u.update_id for u in kept] == ["u0", "failed"]  # the result that does not fit
    assert kept[1].failure is not None and kept[1].failure.stack == ""
