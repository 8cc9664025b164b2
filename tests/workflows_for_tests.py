"""Workflows and activities for the end-to-end tests.

Importable both in the test process (``import tests.workflows_for_tests``, with the
repository root on ``sys.path``) and by engine processes started as subprocesses with
``--module tests.workflows_for_tests`` from the repository root. Names start with ``t.`` so
they cannot collide with the shipped examples.

Everything here is deterministic across processes: activities that behave differently per
attempt read the attempt number from ``current_activity()``, never from process memory.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from engine import ApplicationError, RetryPolicy, WorkflowContext, activity, workflow
from engine.core.activity_info import current_activity

FAST_RETRY = RetryPolicy(max_attempts=5, initial_interval=0.1, backoff_coefficient=1.0)


# --- activities ------------------------------------------------------------------------------


@activity(name="t.add")
def add(args: dict[str, int]) -> int:
    return args["x"] + args["y"]


@activity(name="t.flaky")
def flaky(fail_times: int) -> int:
    """Fails (retryably) on the first ``fail_times`` attempts, then returns the attempt."""
    attempt = current_activity().attempt
    if attempt <= fail_times:
        raise ConnectionError(f"attempt {attempt} hit a transient error")
    return attempt


@activity(name="t.decline")
def decline(reason: str) -> None:
    raise ApplicationError(f"card declined: {reason}", type="CardDeclined", non_retryable=True)


# --- workflows -------------------------------------------------------------------------------


@workflow(name="t.echo")
async def echo(ctx: WorkflowContext, value: Any) -> Any:
    return value


@workflow(name="t.wait_event")
async def wait_event(ctx: WorkflowContext, spec: dict[str, Any] | None) -> dict[str, Any]:
    """Waits for one event (``spec['event']``, default ``go``), optionally with a timeout."""
    spec = spec or {}
    data = await ctx.wait_for_event(spec.get("event", "go"), timeout=spec.get("timeout"))
    return {"input": spec, "got": data}


@workflow(name="t.tagged")
async def tagged(ctx: WorkflowContext, spec: dict[str, Any]) -> dict[str, str]:
    """Upserts ``spec['tags']``, waits for ``go`` if ``spec['wait']``, returns its tags."""
    ctx.upsert_tags(spec.get("tags", {}))
    if spec.get("wait"):
        await ctx.wait_for_event("go")
    return ctx.tags


@workflow(name="t.parent_with_child")
async def parent_with_child(ctx: WorkflowContext, spec: dict[str, Any] | None) -> Any:
    """Starts a child that waits for an event and waits for the child's result."""
    return await ctx.call_child_workflow(wait_event, spec, instance_id=f"{ctx.instance_id}:child")


@workflow(name="t.cleans_up")
async def cleans_up(ctx: WorkflowContext, _: Any) -> str:
    """A child that waits forever; when cancelled it records that it cleaned up."""
    try:
        await ctx.wait_for_event("never")
    except BaseException:
        ctx.set_custom_status("cleaned up")
        await ctx.sleep(0.05)
        raise
    return "unreachable"


@workflow(name="t.parent_close")
async def parent_close(ctx: WorkflowContext, spec: dict[str, Any]) -> str:
    """Starts a ``t.cleans_up`` child per generation under ``spec["policy"]`` and leaves it
    running; continues as new ``spec["generations"]`` times, then waits for "finish"."""
    ctx.call_child_workflow(
        cleans_up,
        None,
        instance_id=f"{ctx.instance_id}:kid{ctx.generation}",
        parent_close_policy=spec["policy"],
    )
    if ctx.generation < spec.get("generations", 0):
        await ctx.sleep(0.05)
        ctx.continue_as_new(spec)
    await ctx.wait_for_event("finish")
    return "finished"


@workflow(name="t.counter")
async def counter(ctx: WorkflowContext, state: dict[str, int]) -> dict[str, int]:
    """A monitor loop: one short durable sleep and one activity per generation, then
    continue-as-new with the counter advanced, until ``limit`` generations ran."""
    await ctx.sleep(0.05)
    acc = await ctx.call_activity(add, {"x": state["acc"], "y": state["n"]})
    n = state["n"] + 1
    if n < state["limit"]:
        ctx.continue_as_new({"n": n, "acc": acc, "limit": state["limit"]})
    return {"n": n, "acc": acc, "generation": ctx.generation}


@workflow(name="t.spin")
async def spin(ctx: WorkflowContext, turns_per_run: int) -> None:
    """Keeps its partition busy until terminated: one turn (one transaction) after another,
    each a zero-length timer; a continue-as-new every ``turns_per_run`` turns bounds the
    history."""
    for _ in range(turns_per_run):
        await ctx.sleep(0)
    ctx.continue_as_new(turns_per_run)


@workflow(name="t.flaky")
async def flaky_workflow(ctx: WorkflowContext, fail_times: int) -> int:
    result: int = await ctx.call_activity(flaky, fail_times, retry=FAST_RETRY)
    return result


@workflow(name="t.declined")
async def declined(ctx: WorkflowContext, reason: str) -> None:
    await ctx.call_activity(decline, reason, retry=FAST_RETRY)


class BadInputError(ValueError):
    pass


@workflow(name="t.raises", failure_types=(BadInputError,))
async def raises(ctx: WorkflowContext, value: Any) -> None:
    raise BadInputError(f"cannot handle {value!r}")


@workflow(name="t.parent_of_failing")
async def parent_of_failing(ctx: WorkflowContext, value: Any) -> Any:
    return await ctx.call_child_workflow(raises, value, instance_id=f"{ctx.instance_id}:child")


def _double(x: int) -> int:
    return 2 * x


@workflow(name="t.timer_inline")
async def timer_inline(ctx: WorkflowContext, spec: dict[str, Any]) -> int:
    """A durable timer, then an inline step: returns ``2 * x``."""
    await ctx.sleep(spec["sleep"])
    result: int = await ctx.run("double", _double, spec["x"])
    return result


@workflow(name="t.timer_then_activity")
async def timer_then_activity(ctx: WorkflowContext, spec: dict[str, Any]) -> int:
    """A durable timer, then an activity: returns ``x + 1``."""
    await ctx.sleep(spec["sleep"])
    result: int = await ctx.call_activity(add, {"x": spec["x"], "y": 1})
    return result


# --- versions: two registered, starts without a version run the newest ------------------------


@workflow(name="t.versioned", version="1")
async def versioned_1(ctx: WorkflowContext, value: Any) -> str:
    return f"v1 got {value}"


@workflow(name="t.versioned", version="2")
async def versioned_2(ctx: WorkflowContext, value: Any) -> str:
    return f"v2 got {value}"


@workflow(name="t.versioned_parent")
async def versioned_parent(ctx: WorkflowContext, value: Any) -> str:
    result: str = await ctx.call_child_workflow("t.versioned", value)
    return result


@workflow(name="t.child_and_activity")
async def child_and_activity(ctx: WorkflowContext, x: int) -> dict[str, Any]:
    """An activity and a child (default child id ``<id>:0:1``): what a parent purged and
    started again under its old id must still get."""
    total = await ctx.call_activity(add, {"x": x, "y": 1})
    child = await ctx.call_child_workflow(echo, {"from": ctx.instance_id, "x": x})
    return {"total": total, "child": child}


@activity(name="t.upper")
def upper(text: str) -> str:
    return text.upper()


@workflow(name="t.upper_and_child")
async def upper_and_child(ctx: WorkflowContext, text: str) -> dict[str, Any]:
    """A value through an activity and a child, both ways (the payload codec tests)."""
    shouted = await ctx.call_activity(upper, text)
    child = await ctx.call_child_workflow(echo, text)
    return {"shouted": shouted, "child": child}


@workflow(name="t.upper_then_wait")
async def upper_then_wait(ctx: WorkflowContext, text: str) -> dict[str, Any]:
    """An activity, then an event: the event's turn replays the activity on a cold load."""
    shouted = await ctx.call_activity(upper, text)
    got = await ctx.wait_for_event("go")
    return {"shouted": shouted, "got": got}


@workflow(name="t.drain")
async def drain(ctx: WorkflowContext, state: dict[str, Any]) -> dict[str, Any]:
    """Reads ``per`` events per generation, checking they come in the order sent, and
    continues as new until it has read ``total``."""
    for _ in range(state["per"]):
        value = await ctx.wait_for_event("e")
        state["ordered"] = state["ordered"] and value == state["count"]
        state["count"] += 1
    if state["count"] >= state["total"]:
        return state
    ctx.continue_as_new(state)


@workflow(name="t.ledger")
async def ledger(ctx: WorkflowContext, start: int) -> int:
    """Takes ``deposit`` updates (validated positive; each awaits the ``t.add`` activity
    and returns the new balance) until a ``close`` event, then returns the balance."""
    balance = {"value": start}

    def positive(amount: int) -> None:
        if amount <= 0:
            raise ValueError(f"a deposit is positive, not {amount}")

    async def deposit(amount: int) -> int:
        balance["value"] = await ctx.call_activity(add, {"x": balance["value"], "y": amount})
        return balance["value"]

    ctx.set_update_handler("deposit", deposit, validator=positive)
    await ctx.wait_for_event("close")
    await ctx.wait_condition(ctx.all_updates_finished)
    return balance["value"]


@workflow(name="t.rolling_ledger")
async def rolling_ledger(ctx: WorkflowContext, start: int) -> int:
    """A ledger taking ``deposit`` updates that continues as new with its balance on a
    ``command`` event ``"roll"`` and returns it on ``"close"``."""
    balance = {"value": start}

    async def deposit(amount: int) -> int:
        balance["value"] = await ctx.call_activity(add, {"x": balance["value"], "y": amount})
        return balance["value"]

    ctx.set_update_handler("deposit", deposit)
    command = await ctx.wait_for_event("command")
    await ctx.wait_condition(ctx.all_updates_finished)
    if command == "close":
        return balance["value"]
    ctx.continue_as_new(balance["value"])


@activity(name="t.pause")
def pause(seconds: float) -> float:
    """Takes ``seconds`` on the worker."""
    time.sleep(seconds)
    return seconds


@workflow(name="t.slow_ledger")
async def slow_ledger(ctx: WorkflowContext, start: int) -> int:
    """Takes ``deposit`` updates ``{"amount": n, "after": seconds, "via": "timer"}`` whose
    handler waits before it adds, on a durable timer or (``"via": "activity"``) for the
    ``t.pause`` activity, so an update is accepted in one turn and completed in a later
    one; returns the balance after a ``close`` event."""
    balance = {"value": start}

    async def deposit(arg: dict[str, Any]) -> int:
        if arg.get("via") == "activity":
            await ctx.call_activity(pause, arg["after"])
        else:
            await ctx.sleep(arg["after"])
        balance["value"] += arg["amount"]
        return balance["value"]

    ctx.set_update_handler("deposit", deposit)
    await ctx.wait_for_event("close")
    await ctx.wait_condition(ctx.all_updates_finished)
    return balance["value"]


@workflow(name="t.tally")
async def tally(ctx: WorkflowContext, start: int) -> int:
    """Counts the ``add`` events until ``stop``; queries ``count``, ``plus`` and ``peek``
    (which tries to sleep, so it is refused) read the count."""
    count = start
    ctx.set_query_handler("count", lambda: count)
    ctx.set_query_handler("plus", lambda n: count + n)
    ctx.set_query_handler("peek", lambda: ctx.sleep(1))
    while True:
        step = await ctx.wait_for_event("add")
        if step == "stop":
            return count
        count += step


# --- large payloads (kept on the payloads topic) ----------------------------------------------


def big_text(size: int, seed: str) -> str:
    """``size`` characters that differ with ``seed`` (a value no codec shortcut can fake)."""
    unit = hashlib.sha256(seed.encode()).hexdigest()
    return (unit * (size // len(unit) + 1))[:size]


def fingerprint(text: str) -> list[Any]:
    return [len(text), hashlib.sha256(text.encode()).hexdigest()]


@activity(name="t.big_result")
def big_result(args: dict[str, Any]) -> str:
    return big_text(args["size"], args["seed"])


@workflow(name="t.big_round_trip")
async def big_round_trip(ctx: WorkflowContext, args: dict[str, Any]) -> dict[str, Any]:
    """A large input in, a large activity result back: the fingerprints of both (the
    large-payload tests; the values themselves stay on the payloads topic)."""
    result = await ctx.call_activity(big_result, {"size": args["result_size"], "seed": "r"})
    return {"input": fingerprint(args["text"]), "result": fingerprint(result)}


@activity(name="t.big_echo")
def big_echo(text: str) -> str:
    return text[::-1]


@workflow(name="t.big_everything")
async def big_everything(ctx: WorkflowContext, args: dict[str, Any]) -> dict[str, Any]:
    """Every kind of payload large: the activity's input and result, a child's input and
    output, an event from outside, an event sent to another instance, its own output."""
    text = big_text(args["size"], "all")
    echoed = await ctx.call_activity(big_echo, text)
    child = await ctx.call_child_workflow(echo, text, instance_id=f"{ctx.instance_id}-child")
    got = await ctx.wait_for_event("go")
    ctx.send_event(args["peer"], "go", text)
    return {
        "echo": fingerprint(echoed),
        "child": fingerprint(child),
        "event": fingerprint(got),
        "text": text,
    }


@workflow(name="t.big_peer")
async def big_peer(ctx: WorkflowContext, _: Any = None) -> list[Any]:
    """Waits for one event and gives its fingerprint."""
    return fingerprint(await ctx.wait_for_event("go"))
