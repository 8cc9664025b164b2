"""Commands are answered once and applied at most once: de-duplication by request id, the
command outcome records, refusals as typed errors, signal-with-start, and pending events
that expire into dead letters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Registry, WorkflowContext
from engine.codec import decode_message
from engine.config.settings import Settings
from engine.core.errors import (
    CommandRefusedError,
    InstanceAlreadySuspendedError,
    InstanceNotFoundError,
    InstanceNotRunningError,
    InstanceNotSuspendedError,
    WorkflowAlreadyRanError,
    WorkflowAlreadyRunningError,
)
from engine.core.history import (
    EventRaised,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    ExecutionTerminated,
    RuntimeStatus,
)
from engine.core.instance_row import InstanceRow
from engine.core.messages import (
    CommandOutcome,
    CommandResult,
    IdReusePolicy,
    RaiseEvent,
    StartWorkflow,
)
from engine.core.payloads import to_payload
from engine.services.client.outcomes import REFUSALS, raise_for_refusal, refusal_error
from engine.services.processor.command_outcomes import accepted, find, remember
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="collect")
async def collect(ctx: WorkflowContext, _: Any) -> list[Any]:
    items: list[Any] = []
    while True:
        value = await ctx.wait_for_event("item")
        if value == "end":
            return items
        items.append(value)


@registry.workflow(name="echo")
async def echo(ctx: WorkflowContext, value: Any) -> Any:
    return value


@pytest.fixture
def env() -> Iterator[TestEngine]:
    with TestEngine(registry, partitions=2) as engine:
        yield engine


def outcomes(env: TestEngine) -> list[CommandOutcome]:
    found = []
    for record in env.records("command-outcomes"):
        assert record.value is not None
        outcome = decode_message(record.value)
        assert isinstance(outcome, CommandOutcome) and record.key == outcome.instance_id.encode()
        found.append(outcome)
    return found


# --- de-duplication ---------------------------------------------------------------------------


def test_the_same_raise_sent_twice_is_delivered_once(env: TestEngine) -> None:
    env.start("collect", instance_id="c")
    env.run()
    first = env.raise_event("c", "item", 1, request_id="retry-me")
    again = env.raise_event("c", "item", 1, request_id="retry-me")  # a client retry
    env.raise_event("c", "item", "end")
    assert env.wait_for_completion("c").output == [1]
    assert first is not None and again is not None
    assert (first.result, first.duplicate) == (CommandResult.ACCEPTED, False)
    assert (again.result, again.duplicate) == (CommandResult.ACCEPTED, True)
    assert len([e for e in env.history("c") if isinstance(e.body, EventRaised)]) == 2


def test_a_duplicate_in_the_same_batch_is_delivered_once(env: TestEngine) -> None:
    env.start("collect", instance_id="c")
    env.run()
    raised = RaiseEvent("c", "item", to_payload("x"), "r-1")
    for _ in range(2):
        env.send(raised)
    env.send(RaiseEvent("c", "item", to_payload("end"), "r-2"))
    assert env.wait_for_completion("c").output == ["x"]
    assert [o.duplicate for o in outcomes(env) if o.request_id == "r-1"] == [False, True]


def test_an_older_start_sent_again_after_a_newer_run_starts_nothing(env: TestEngine) -> None:
    env.start("echo", "first", instance_id="e", request_id="start-1")
    env.run()
    env.start("echo", "second", instance_id="e", request_id="start-2")
    env.run()
    assert env.get("e").generation == 1  # type: ignore[union-attr]
    answer = env.client.send(
        StartWorkflow("e", name="echo", input=to_payload("first"), request_id="start-1"),
        wait=True,
    )
    env.run()
    assert answer is not None and answer.duplicate
    state = env.get("e")
    assert state is not None and (state.output, state.generation) == ("second", 1)
    assert len([e for e in env.history("e") if isinstance(e.body, ExecutionStarted)]) == 2


def test_suspend_resume_and_terminate_sent_twice_are_applied_once(env: TestEngine) -> None:
    # applied again, each second command would be refused (already suspended, not
    # suspended, not running); de-duplicated, it gets its first answer again
    env.start("collect", instance_id="c")
    env.run()
    sends = [
        lambda: env.suspend("c", "look", request_id="su"),
        lambda: env.resume("c", request_id="re"),
        lambda: env.terminate("c", "stop", request_id="te"),
    ]
    for send in sends:
        first, again = send(), send()
        assert first is not None and again is not None
        assert (first.result, first.duplicate) == (CommandResult.ACCEPTED, False)
        assert (again.result, again.duplicate) == (CommandResult.ACCEPTED, True)
    kinds = [type(e.body) for e in env.history("c")]
    assert [kinds.count(k) for k in (ExecutionSuspended, ExecutionResumed)] == [1, 1]
    assert kinds.count(ExecutionTerminated) == 1
    assert env.get("c").status is RuntimeStatus.TERMINATED  # type: ignore[union-attr]


def test_a_purge_sent_again_finds_nothing_to_purge(env: TestEngine) -> None:
    # the purge removed the window with the rest of the instance's state (docs: commands.md)
    env.start("echo", "x", instance_id="p")
    env.run()
    purged = env.purge("p", request_id="pu")
    assert purged is not None and purged.result is CommandResult.ACCEPTED
    with pytest.raises(InstanceNotFoundError):
        env.purge("p", request_id="pu")
    assert env.get("p") is None


def test_the_window_survives_a_restart(env: TestEngine) -> None:
    env.start("collect", instance_id="c")
    env.run()
    env.raise_event("c", "item", 1, request_id="r")
    env.deploy(registry)  # the processors forget their hot instances: rows are reloaded
    again = env.raise_event("c", "item", 1, request_id="r")
    env.raise_event("c", "item", "end")
    assert again is not None and again.duplicate
    assert env.wait_for_completion("c").output == [1]


def test_the_window_is_bounded_by_count_and_age() -> None:
    settings = Settings(dedup_window=2, dedup_window_ms=60_000)
    with TestEngine(registry, settings=settings) as env:
        env.start("collect", instance_id="c", request_id="s")
        env.run()
        for n in range(3):
            env.raise_event("c", "item", n, request_id=f"r{n}")
        # r0 left the window (count 2): sent again, it is a new event
        assert not env.raise_event("c", "item", 0, request_id="r0").duplicate  # type: ignore[union-attr]
        assert env.raise_event("c", "item", 2, request_id="r2").duplicate  # type: ignore[union-attr]
        env.advance(timedelta(minutes=2))
        # r2 is older than dedup_window_ms now
        assert not env.raise_event("c", "item", 2, request_id="r2").duplicate  # type: ignore[union-attr]
        env.raise_event("c", "item", "end")
        assert env.wait_for_completion("c").output == [0, 1, 2, 0, 2]


# --- outcomes and refusals ----------------------------------------------------------------------


def test_every_command_is_answered_on_the_outcome_topic(env: TestEngine) -> None:
    env.start("collect", instance_id="c", request_id="s-1")
    env.suspend("c", "look", request_id="su-1")
    env.resume("c", request_id="re-1")
    env.raise_event("c", "item", "end", request_id="ra-1")
    env.run()
    env.purge("c", request_id="pu-1")
    answered = {o.request_id: o for o in outcomes(env)}
    assert set(answered) == {"s-1", "su-1", "re-1", "ra-1", "pu-1"}
    assert all(o.result is CommandResult.ACCEPTED and not o.error for o in answered.values())
    assert answered["s-1"].command == "StartWorkflow"
    assert answered["s-1"].status is RuntimeStatus.RUNNING
    assert answered["pu-1"].status is None


def test_refusals_raise_typed_errors_with_the_status(env: TestEngine) -> None:
    with pytest.raises(InstanceNotFoundError, match="no instance nobody"):
        env.terminate("nobody")
    with pytest.raises(InstanceNotFoundError):
        env.purge("nobody")
    env.start("collect", instance_id="c")
    env.run()
    with pytest.raises(InstanceNotSuspendedError, match="neither suspended nor parked"):
        env.resume("c")
    env.suspend("c")
    with pytest.raises(InstanceAlreadySuspendedError) as twice:
        env.suspend("c")
    assert twice.value.outcome.status is RuntimeStatus.SUSPENDED
    env.terminate("c", "done")
    env.run()
    for command in (env.suspend, env.terminate, env.resume):
        with pytest.raises(InstanceNotRunningError, match="TERMINATED"):
            command("c")
    counters = env.processors[env.partition_of("c")].counters
    assert counters.refusals[("SuspendWorkflow", "InstanceAlreadySuspendedError")] == 1
    assert counters.command_outcomes[("StartWorkflow", "accepted")] == 1
    assert counters.command_outcomes[("TerminateWorkflow", "refused")] == 1


def test_a_refusal_carries_its_stable_code_and_a_duplicate_repeats_it(env: TestEngine) -> None:
    env.start("collect", instance_id="c")
    env.run()
    for _ in range(2):
        with pytest.raises(InstanceNotSuspendedError):
            env.resume("c", request_id="re-1")
    first, again = [o for o in outcomes(env) if o.request_id == "re-1"]
    assert (first.code, first.error) == ("instance_not_suspended", "InstanceNotSuspendedError")
    assert again.duplicate and (again.code, again.error) == (first.code, first.error)
    assert all(not o.code for o in outcomes(env) if o.result is not CommandResult.REFUSED)


def _refusal(code: str = "", error: str = "") -> CommandOutcome:
    return CommandOutcome(
        "i",
        command="ResumeWorkflow",
        result=CommandResult.REFUSED,
        reason="why",
        error=error,
        code=code,
    )


def test_the_client_maps_codes_to_errors_and_old_answers_by_class_name() -> None:
    assert refusal_error(_refusal("already_running")) is WorkflowAlreadyRunningError
    # an answer written before codes existed names the class only
    assert refusal_error(_refusal("", "InstanceNotFoundError")) is InstanceNotFoundError
    # the code wins over the name (a class renamed later keeps its code)
    assert refusal_error(_refusal("instance_not_found", "OldName")) is InstanceNotFoundError
    # what this client does not know is still a refusal
    assert refusal_error(_refusal("from_the_future")) is CommandRefusedError
    assert refusal_error(_refusal("", "NoSuchError")) is CommandRefusedError
    with pytest.raises(WorkflowAlreadyRanError, match="refused: why; use a new instance id"):
        raise_for_refusal(_refusal("already_ran"))


def test_every_refusal_has_its_own_code_in_the_table() -> None:
    classes = _subclasses(CommandRefusedError)
    assert sorted(REFUSALS.values(), key=lambda c: c.__name__) == sorted(
        classes, key=lambda c: c.__name__
    )
    assert all(REFUSALS[cls.code] is cls for cls in classes)


def _subclasses(cls: type[CommandRefusedError]) -> list[type[CommandRefusedError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_subclasses(sub))
    return found


def test_a_raise_before_the_start_is_answered_buffered(env: TestEngine) -> None:
    answer = env.raise_event("later", "item", "early")
    assert answer is not None and answer.result is CommandResult.BUFFERED
    assert "not started" in answer.reason and answer.status is None
    env.start("collect", instance_id="later")
    env.raise_event("later", "item", "end")
    assert env.wait_for_completion("later").output == ["early"]


def test_commands_without_a_request_id_are_applied_but_not_answered(env: TestEngine) -> None:
    env.start("collect", instance_id="c")
    env.run()
    before = len(outcomes(env))
    env.send(RaiseEvent("c", "item", to_payload("end")))
    assert env.wait_for_completion("c").output == []
    assert len(outcomes(env)) == before


def test_wait_false_only_writes_the_command(env: TestEngine) -> None:
    assert env.raise_event("x", "item", 1, wait=False) is None
    assert outcomes(env) == []
    env.run()
    assert [o.result for o in outcomes(env)] == [CommandResult.BUFFERED]


# --- signal with start ----------------------------------------------------------------------------


def test_raise_then_start_on_a_finished_id_no_longer_loses_the_event(env: TestEngine) -> None:
    env.start("echo", "done", instance_id="f")
    env.run()
    # a plain raise to the ended instance is refused, not dropped silently
    with pytest.raises(InstanceNotRunningError, match="COMPLETED"):
        env.raise_event("f", "item", "lost?")
    # signal_with_start starts a new run and delivers the event in the same turn
    answer = env.signal_with_start("collect", "f", "item", "kept").outcome
    assert answer is not None and answer.result is CommandResult.ACCEPTED
    assert "started" in answer.reason
    env.raise_event("f", "item", "end")
    state = env.wait_for_completion("f")
    assert (state.output, state.generation) == (["kept"], 1)
    generation = [e for e in env.history("f") if e.generation == 1]
    first_turn = [type(e.body).__name__ for e in generation[:3]]
    assert first_turn == ["TurnStarted", "ExecutionStarted", "EventRaised"]


def test_signal_with_start_delivers_to_a_running_instance(env: TestEngine) -> None:
    env.start("collect", instance_id="r")
    env.run()
    answer = env.signal_with_start("collect", "r", "item", 1, input="ignored").outcome
    assert answer is not None and "delivered" in answer.reason
    env.raise_event("r", "item", "end")
    state = env.wait_for_completion("r")
    assert (state.output, state.generation) == ([1], 0)


def test_signal_with_start_of_a_new_id_starts_it(env: TestEngine) -> None:
    env.signal_with_start("collect", "n", "item", 7, tags={"k": "v"})
    env.raise_event("n", "item", "end")
    state = env.wait_for_completion("n")
    assert state.output == [7] and state.tags == {"k": "v"}


def test_signal_with_start_keeps_the_event_of_a_scheduled_instance(env: TestEngine) -> None:
    env.start("collect", instance_id="s", start_at=env.now() + timedelta(hours=1))
    answer = env.signal_with_start("collect", "s", "item", "early").outcome
    assert answer is not None and answer.result is CommandResult.BUFFERED
    env.advance(timedelta(hours=2))
    env.raise_event("s", "item", "end")
    assert env.wait_for_completion("s").output == ["early"]


def test_start_reuse_policy_still_applies_to_ignored_starts(env: TestEngine) -> None:
    env.start("collect", instance_id="i")
    answer = env.client.send(
        StartWorkflow(
            "i", name="collect", reuse_policy=IdReusePolicy.IGNORE_IF_RUNNING, request_id="x"
        ),
        wait=True,
    )
    assert answer is not None and "IGNORE_IF_RUNNING" in answer.reason


# --- pending events that expire ---------------------------------------------------------------


def test_events_past_the_pending_ttl_go_to_dead_letters_at_start() -> None:
    settings = Settings(pending_events_ttl_ms=60_000)
    with TestEngine(registry, settings=settings) as env:
        env.raise_event("late", "item", "stale")
        env.advance(timedelta(minutes=5))
        env.raise_event("late", "item", "fresh")
        env.start("collect", instance_id="late")
        env.raise_event("late", "item", "end")
        assert env.wait_for_completion("late").output == ["fresh"]
        (letter,) = env.dead_letters()
        assert "pending_events_ttl_ms" in letter.reason and letter.instance_id == "late"
        assert letter.value is not None
        resend = decode_message(letter.value)
        assert isinstance(resend, RaiseEvent) and resend.name == "item"
        counters = env.processors[0].counters
        assert counters.dead_letter_kinds == {"PendingEventExpired": 1}


# --- the window, as a model --------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 50)), max_size=40),
    st.integers(0, 5),
    st.integers(0, 100),
)
def test_the_window_remembers_exactly_the_newest_recent_requests(
    steps: list[tuple[str, int]], count: int, age_ms: int
) -> None:
    """Against a model: a request id is found iff it is among the last ``count`` remembered
    requests and was remembered no longer than ``age_ms`` ago."""
    meta = InstanceRow("i")
    now = 0
    remembered: list[tuple[str, int]] = []
    for request_id, step_ms in steps:
        now += step_ms
        seen = find(meta, request_id, now - age_ms)
        recent = [r for r, t in remembered[-count:] if t >= now - age_ms] if count else []
        assert (seen is not None) == (request_id in recent)
        if seen is None:
            remember(meta, request_id, accepted(), now, count, age_ms)
            remembered.append((request_id, now))
        assert len(meta.seen_requests) <= count


# --- signal with start under an ID-reuse policy ------------------------------------------------


def test_signal_with_start_under_reject_duplicate_refuses_an_ended_id(env: TestEngine) -> None:
    env.start("echo", "done", instance_id="once")
    env.run()
    with pytest.raises(WorkflowAlreadyRanError, match="REJECT_DUPLICATE"):
        env.signal_with_start(
            "collect", "once", "item", 1, reuse_policy=IdReusePolicy.REJECT_DUPLICATE
        )
    state = env.get("once")
    assert state is not None and (state.status, state.generation) == (RuntimeStatus.COMPLETED, 0)
    env.start("collect", instance_id="live")
    env.run()
    answer = env.signal_with_start(
        "collect", "live", "item", 2, reuse_policy=IdReusePolicy.REJECT_DUPLICATE
    ).outcome
    assert answer is not None and "delivered" in answer.reason  # a live one is signalled


def test_signal_with_start_under_error_if_running_refuses_a_live_id(env: TestEngine) -> None:
    env.start("collect", instance_id="busy")
    env.run()
    with pytest.raises(WorkflowAlreadyRunningError, match="ERROR_IF_RUNNING"):
        env.signal_with_start(
            "collect", "busy", "item", "lost?", reuse_policy=IdReusePolicy.ERROR_IF_RUNNING
        )
    env.raise_event("busy", "item", "end")
    assert env.wait_for_completion("busy").output == []  # the refused event was not delivered
    answer = env.signal_with_start(
        "collect", "busy", "item", 3, reuse_policy=IdReusePolicy.ERROR_IF_RUNNING
    ).outcome
    assert answer is not None and "started a new run" in answer.reason


def test_signal_with_start_under_terminate_if_running_replaces_the_run(env: TestEngine) -> None:
    env.start("collect", instance_id="swap")
    env.run()
    env.raise_event("swap", "item", "old")
    answer = env.signal_with_start(
        "collect", "swap", "item", "new", reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING
    ).outcome
    assert answer is not None and "started a new run" in answer.reason
    env.raise_event("swap", "item", "end")
    state = env.wait_for_completion("swap")
    assert (state.output, state.generation) == (["new"], 1)
    ends = [e.body for e in env.history("swap") if e.generation == 0]
    assert any(getattr(b, "status", None) is RuntimeStatus.TERMINATED for b in ends)
    env.start("collect", instance_id="later", start_at=env.now() + timedelta(hours=1))
    env.signal_with_start(
        "collect", "later", "item", "now", reuse_policy=IdReusePolicy.TERMINATE_IF_RUNNING
    )
    env.run()
    assert env.get("later").status is RuntimeStatus.RUNNING  # type: ignore[union-attr]
