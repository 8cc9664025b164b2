"""Queries through TestEngine: a handler answers from the instance's live state, writes
no history, refuses to decide anything, and every failure comes back as a typed error."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.config.settings import Settings
from engine.core.errors import InstanceNotFoundError, QueryFailedError, UnknownQueryError
from engine.core.history import RuntimeStatus
from engine.testing import TestEngine

app = Registry()


@app.activity(name="pack")
def pack(item: str) -> str:
    return f"packed {item}"


@app.workflow(name="cart")
async def cart(ctx: WorkflowContext, owner: str) -> list[str]:
    items: list[str] = []
    ctx.set_query_handler("items", lambda: list(items))
    ctx.set_query_handler("has", lambda item: item in items)
    ctx.set_query_handler("owner", lambda: owner)
    ctx.set_query_handler("broken", lambda: items[99])
    ctx.set_query_handler("sneaky", lambda: ctx.call_activity(pack, "x"))
    ctx.set_query_handler("napper", lambda: ctx.sleep(5))
    ctx.set_query_handler("status", lambda: ctx.set_custom_status("changed"))
    ctx.set_query_handler("dice", lambda: ctx.random().random())
    ctx.set_query_handler("opaque", lambda: object())

    def swallowing() -> str:
        try:
            ctx.send_event("elsewhere", "hi")
        except Exception:
            return "got away with it"
        return "sent"

    ctx.set_query_handler("swallowing", swallowing)
    while True:
        item = await ctx.wait_for_event("add")
        if item == "checkout":
            break
        items.append(await ctx.call_activity(pack, item))
    return [*items, str(ctx.random().random())]


def _history_kinds(env: TestEngine, run: str) -> list[str]:
    return [type(e.body).__name__ for e in env.history(run)]


def test_a_query_answers_from_the_live_state_and_records_nothing() -> None:
    with TestEngine(app) as env:
        run = env.start("cart", "ada")
        env.run()
        assert run.query("items") == []
        env.raise_event(run, "add", "book")
        env.run()
        before = _history_kinds(env, run)
        assert run.query("items") == ["packed book"]
        assert env.query(run, "has", "packed book") is True
        assert env.query(run, "has", "pen") is False
        assert run.query("owner") == "ada"
        assert _history_kinds(env, run) == before


def test_an_unknown_query_is_answered_with_the_known_names() -> None:
    with TestEngine(app) as env:
        run = env.start("cart", "ada")
        env.run()
        with pytest.raises(UnknownQueryError, match=r"'items'.*'owner'") as caught:
            run.query("total")
        assert "no query 'total'" in str(caught.value)


def test_a_handler_that_raises_or_returns_no_json_gets_a_clear_error() -> None:
    with TestEngine(app) as env:
        run = env.start("cart", "ada")
        env.run()
        with pytest.raises(QueryFailedError, match="raised IndexError"):
            run.query("broken")
        with pytest.raises(QueryFailedError, match="no JSON value"):
            run.query("opaque")
        with pytest.raises(QueryFailedError, match=r"'has'.*TypeError"):
            run.query("has")  # a missing argument


@pytest.mark.parametrize("name", ["sneaky", "napper", "status", "swallowing"])
def test_a_handler_that_tries_to_decide_anything_is_refused_and_changes_nothing(
    name: str,
) -> None:
    with TestEngine(app) as env:
        run = env.start("cart", "ada")
        env.run()
        before = _history_kinds(env, run)
        with pytest.raises(QueryFailedError, match="read-only"):
            run.query(name)
        env.raise_event(run, "add", "book")
        env.raise_event(run, "add", "checkout")
        state = env.wait_for_completion(run)
        assert state.status is RuntimeStatus.COMPLETED
        assert _history_kinds(env, run)[: len(before)] == before
        assert state.custom_status is None


def test_a_query_that_draws_random_numbers_does_not_shift_the_workflow_sequence() -> None:
    outputs = []
    for asked in (False, True):
        with TestEngine(app) as env:
            run = env.start("cart", "ada", instance_id="cart-1")
            env.run()
            if asked:
                assert 0 <= run.query("dice") < 1
                assert run.query("dice") == run.query("dice")  # the same state each time
            env.raise_event(run, "add", "checkout")
            outputs.append(env.wait_for_completion(run).output)
    assert outputs[0] == outputs[1]


def test_an_ended_instance_answers_from_its_last_state() -> None:
    with TestEngine(app) as env:
        run = env.start("cart", "ada")
        env.raise_event(run, "add", "pen")
        env.raise_event(run, "add", "checkout")
        assert env.wait_for_completion(run).status is RuntimeStatus.COMPLETED
        assert run.query("items") == ["packed pen"]  # replayed: an ended one is not cached
        assert run.query("items") == ["packed pen"]


def test_a_query_on_an_unknown_or_purged_instance_says_so() -> None:
    with TestEngine(app) as env:
        with pytest.raises(InstanceNotFoundError, match="no instance nobody"):
            env.query("nobody", "items")
        run = env.start("cart", "ada")
        env.raise_event(run, "add", "checkout")
        env.wait_for_completion(run)
        run.purge()
        with pytest.raises(InstanceNotFoundError):
            run.query("items")


@app.workflow(name="plain")
async def plain(ctx: WorkflowContext, _: Any) -> None:
    await ctx.wait_for_event("go")


def test_a_workflow_without_handlers_lists_none() -> None:
    with TestEngine(app) as env:
        run = env.start("plain", None)
        env.run()
        with pytest.raises(UnknownQueryError, match=r"its queries: none"):
            run.query("anything")


@app.workflow(name="summer")
async def summer(ctx: WorkflowContext, _: Any) -> dict[str, Any]:
    total = 0
    ctx.set_query_handler("total", lambda: total)
    ctx.set_query_handler("draw", lambda: ctx.random().randint(0, 10**9))
    while (n := await ctx.wait_for_event("n")) is not None:
        total += n
    return {"total": total, "draw": ctx.random().randint(0, 10**9), "id": str(ctx.new_uuid())}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.one_of(st.integers(-5, 5), st.sampled_from(["total", "draw", "nope", "run"])),
        max_size=12,
    )
)
def test_queries_between_events_answer_the_state_so_far_and_change_nothing(
    steps: list[int | str],
) -> None:
    """Every query answers the sum of the events accepted before it; the instance ends with
    the same history, output and random draws as one that was never asked."""

    def play(asked: bool) -> tuple[list[str], Any]:
        with TestEngine(app) as env:
            run = env.start("summer", None, instance_id="sum-1")
            expected = 0
            for step in steps:
                if isinstance(step, int):
                    env.raise_event(run, "n", step)
                    expected += step
                elif step == "run":
                    env.run()
                elif asked and step == "total":
                    assert run.query("total") == expected
                elif asked and step == "draw":
                    assert run.query("draw") == run.query("draw")
                elif asked:
                    with pytest.raises(UnknownQueryError):
                        run.query(step)
            env.raise_event(run, "n", None)
            state = env.wait_for_completion(run)
            assert state.output["total"] == expected
            return _history_kinds(env, run), state.output

    assert play(asked=True) == play(asked=False)


@app.workflow(name="fragile")
async def fragile(ctx: WorkflowContext, _: Any) -> None:
    seen: list[str] = []
    ctx.set_query_handler("seen", lambda: seen)
    while True:
        word = await ctx.wait_for_event("word")
        if word == "boom":
            raise KeyError(word)  # a bug: the instance parks, the turn is not recorded
        seen.append(word)


def test_a_parked_instance_answers_from_its_last_recorded_turn() -> None:
    with TestEngine(app) as env:
        run = env.start("fragile", None)
        env.raise_event(run, "word", "one")
        env.raise_event(run, "word", "boom")
        env.run()
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.PARKED
        assert run.query("seen") == ["one"]


@app.workflow(name="spinner")
async def spinner(ctx: WorkflowContext, _: Any) -> str:
    def forever() -> None:
        while True:
            pass

    ctx.set_query_handler("forever", forever)
    ctx.set_query_handler("ok", lambda: "still here")
    await ctx.wait_for_event("go")
    return "done"


def test_a_handler_that_never_returns_is_stopped_by_the_turn_budget() -> None:
    with TestEngine(app, settings=Settings(turn_budget_ms=200)) as env:
        run = env.start("spinner", None)
        env.run()
        with pytest.raises(QueryFailedError, match="turn budget"):
            run.query("forever")
        assert run.query("ok") == "still here"  # replayed after the stop
        env.raise_event(run, "go")
        assert env.wait_for_completion(run).output == "done"
