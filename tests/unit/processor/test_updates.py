"""Updates through TestEngine: the handler's result comes back to the caller, a rejection
writes no history and comes back as a typed error, an accepted update is journaled and may
await activities (timers: tests/unit/runtime/test_runtime_updates.py), and a retry with the
same update id gets the first answer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine import Registry, WorkflowContext
from engine.core.errors import (
    InstanceNotFoundError,
    UnknownUpdateError,
    UpdateFailedError,
    UpdateRejectedError,
)
from engine.core.history import UpdateAccepted, UpdateCompleted
from engine.core.messages import ResetTarget
from engine.testing import TestEngine

app = Registry()


@dataclass
class Receipt:
    item: str
    count: int


@app.activity(name="reserve")
def reserve(item: str) -> str:
    return f"reserved {item}"


@app.workflow(name="basket")
async def basket(ctx: WorkflowContext, owner: str) -> list[str]:
    items: list[str] = []

    def not_empty(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    async def add(item: str) -> dict[str, object]:
        items.append(await ctx.call_activity(reserve, item))
        return {"item": items[-1], "count": len(items)}

    def broken(_: object) -> None:
        raise RuntimeError("out of stock")

    ctx.set_update_handler("add", add, validator=not_empty)
    ctx.set_update_handler("broken", broken)
    await ctx.wait_for_event("checkout")
    await ctx.wait_condition(ctx.all_updates_finished)
    return items


def _kinds(env: TestEngine, run: str) -> list[str]:
    return [type(e.body).__name__ for e in env.history(run)]


def test_an_update_returns_the_handlers_result_after_awaiting_an_activity() -> None:
    with TestEngine(app) as env:
        run = env.start("basket", "ada")
        env.run()
        assert run.update("add", "book") == {"item": "reserved book", "count": 1}
        receipt = env.update(run, "add", "pen", result_type=Receipt)
        assert receipt == Receipt("reserved pen", 2)
        kinds = _kinds(env, run)
        assert kinds.count("UpdateAccepted") == 2 and kinds.count("UpdateCompleted") == 2
        env.raise_event(run, "checkout")
        env.run()
        assert run.result() == ["reserved book", "reserved pen"]


def test_a_rejected_or_unknown_update_writes_no_history_and_says_why() -> None:
    with TestEngine(app) as env:
        run = env.start("basket", "ada")
        env.run()
        before = _kinds(env, run)
        with pytest.raises(UpdateRejectedError, match="an item needs a name"):
            run.update("add", "")
        with pytest.raises(UnknownUpdateError, match=r"its updates: 'add', 'broken'"):
            run.update("remove", "book")
        assert _kinds(env, run) == before
        with pytest.raises(InstanceNotFoundError):
            env.update("nobody", "add", "book")


def test_a_failing_handler_is_answered_with_its_error_and_journaled() -> None:
    with TestEngine(app) as env:
        run = env.start("basket", "ada")
        env.run()
        with pytest.raises(UpdateFailedError, match="RuntimeError: out of stock"):
            run.update("broken")
        failed = [e.body for e in env.history(run) if type(e.body) is UpdateCompleted]
        assert failed[0].failure is not None


def test_a_retry_with_the_same_update_id_gets_the_first_answer_and_runs_once() -> None:
    with TestEngine(app) as env:
        run = env.start("basket", "ada")
        env.run()
        first = run.update("add", "book", update_id="u-1")
        assert run.update("add", "book", update_id="u-1") == first
        accepted = [e.body for e in env.history(run) if type(e.body) is UpdateAccepted]
        assert [a.update_id for a in accepted] == ["u-1"]


def test_suspended_and_ended_instances_refuse_updates_with_the_reason() -> None:
    with TestEngine(app) as env:
        run = env.start("basket", "ada")
        env.run()
        run.suspend("hold")
        with pytest.raises(UpdateRejectedError, match="SUSPENDED: resume it"):
            run.update("add", "book")
        run.resume()
        env.raise_event(run, "checkout")
        env.run()
        with pytest.raises(UpdateRejectedError, match="COMPLETED: only a running one"):
            run.update("add", "book")


@app.workflow(name="hasty")
async def hasty(ctx: WorkflowContext, _: object) -> str:
    async def slow(item: str) -> str:
        reserved: str = await ctx.call_activity(reserve, item)
        return reserved

    ctx.set_update_handler("slow", slow)
    await ctx.wait_for_event("go")
    return "done"  # without waiting for ctx.all_updates_finished()


def test_an_update_the_workflow_ends_without_finishing_is_answered_failed() -> None:
    with TestEngine(app) as env:
        run = env.start("hasty")
        env.run()
        env.raise_event(run, "go", wait=False)  # the same turn as the update
        with pytest.raises(UpdateFailedError, match="ended COMPLETED first"):
            run.update("slow", "book")
        assert run.result() == "done"


def test_update_with_start_starts_the_instance_and_updates_it_in_one_command() -> None:
    with TestEngine(app) as env:
        first = env.update_with_start(
            "basket", "ada", instance_id="b-1", update="add", arg="book", update_id="u-1"
        )
        assert first == {"item": "reserved book", "count": 1}
        again = env.update_with_start("basket", "ada", instance_id="b-1", update="add", arg="pen")
        assert again == {"item": "reserved pen", "count": 2}  # the live run, not a new one
        assert _kinds(env, "b-1").count("ExecutionStarted") == 1
        with pytest.raises(UpdateRejectedError, match="an item needs a name"):
            env.update_with_start("basket", "bo", instance_id="b-2", update="add", arg="")
        assert env.get("b-2") is not None  # the start stands; the update was rejected
        env.raise_event("b-1", "checkout")
        env.run()
        assert env.wait_for_completion("b-1").status.value == "COMPLETED"


def test_an_update_sent_in_the_batch_that_starts_the_instance_waits_for_its_first_turn() -> None:
    with TestEngine(app) as env:
        run = env.start("basket", "ada", wait=False)
        assert run.update("add", "book") == {"item": "reserved book", "count": 1}


@app.workflow(name="looper")
async def looper(ctx: WorkflowContext, n: int) -> int:
    ctx.set_update_handler("generation", lambda: ctx.generation)
    await ctx.wait_for_event("next")
    await ctx.wait_condition(ctx.all_updates_finished)
    ctx.continue_as_new(n + 1)


def test_an_update_after_a_continue_as_new_reaches_the_new_generations_handlers() -> None:
    with TestEngine(app) as env:
        run = env.start("looper", 0)
        env.run()
        assert run.update("generation") == 0
        env.raise_event(run, "next", wait=False)  # the same batch: the old generation takes it
        assert run.update("generation") == 0
        # the next generation has not begun yet: it begins before this update is offered
        assert run.update("generation") == 1


@app.workflow(name="buggy")
async def buggy(ctx: WorkflowContext, _: object) -> None:
    ctx.set_update_handler("poke", lambda: "poked")
    await ctx.wait_for_event("go")
    raise KeyError("nmae")  # a bug: the instance parks


def test_a_parked_instance_refuses_updates_with_the_reason_and_records_nothing() -> None:
    with TestEngine(app) as env:
        run = env.start("buggy")
        env.run()
        env.raise_event(run, "go")
        env.run()
        state = env.get(run)
        assert state is not None and state.status.value == "PARKED"
        before = _kinds(env, run)
        with pytest.raises(UpdateRejectedError, match=r"PARKED \(its code raised KeyError"):
            run.update("poke")
        assert _kinds(env, run) == before


def test_an_update_to_an_instance_evicted_between_its_generations_is_not_refused() -> None:
    """The generation that continued as new is gone from memory before the next one began
    (a restart, a full cache): the update replays it, begins the next generation, whose
    code runs first and sets its handlers, and is answered there."""
    with TestEngine(app) as env:
        run = env.start("looper", 0)
        env.run()
        env.raise_event(run, "next", wait=False)
        env.step()  # generation 0 continues as new; generation 1 waits for its turn
        assert [e.generation for e in env.history(run.instance_id)][-1] == 0
        for processor in env.processors.values():
            processor.cache.clear()
        assert run.update("generation") == 1
        assert "UpdateAccepted" in _kinds(env, run.instance_id)


def test_an_update_sent_with_the_start_joins_the_first_turn_after_the_code_ran() -> None:
    with TestEngine(app) as env:
        run = env.start("looper", 7, wait=False)
        assert run.update("generation") == 0
        history = env.history(run.instance_id)
        turns = [type(e.body).__name__ for e in history].count("TurnStarted")
        assert turns == 1  # one turn: the start, the code's first run, then the update


def test_a_retry_after_a_continue_as_new_gets_the_first_answer() -> None:
    with TestEngine(app) as env:
        run = env.start("looper", 0)
        assert run.update("generation", update_id="first") == 0
        env.raise_event(run, "next")
        env.run()
        assert run.update("generation", update_id="second") == 1
        for processor in env.processors.values():
            processor.cache.clear()  # replayed from the new generation's history alone
        assert run.update("generation", update_id="first") == 0  # not run again
        assert run.update("generation", update_id="second") == 1
        accepted = [
            (e.generation, e.body.update_id)
            for e in env.history(run.instance_id)
            if isinstance(e.body, UpdateAccepted)
        ]
        assert accepted == [(0, "first"), (1, "second")]


def test_a_reset_to_the_first_turn_keeps_the_updates_the_run_carried() -> None:
    with TestEngine(app) as env:
        run = env.start("looper", 0)
        assert run.update("generation", update_id="first") == 0
        env.raise_event(run, "next")
        env.run()
        env.reset(run, ResetTarget.FIRST_TURN, "again")  # generation 1 begins again
        assert run.update("generation", update_id="first") == 0  # still the first answer
        assert run.update("generation", update_id="later") == 2
