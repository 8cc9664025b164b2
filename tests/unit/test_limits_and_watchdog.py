"""Size limits and the turn watchdog, on their own."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config.settings import load_settings
from engine.config.topics import desired_topics, load_spec, topic_max_message_bytes
from engine.core.errors import ConfigurationError, PayloadTooLargeError, WorkflowTurnTimeoutError
from engine.core.limits import Limits, fit_status, status_size
from engine.core.messages import InstanceStatus
from engine.core.payloads import Payload
from engine.services.watchdog import TurnWatchdog


def test_a_payload_over_its_limit_names_the_limit_and_the_value() -> None:
    with pytest.raises(PayloadTooLargeError) as caught:
        Limits(event=10).check("event", "the payload of event 'go'", Payload(b"x" * 11))
    error = caught.value
    assert (error.size, error.limit, error.limit_name) == (11, 10, "max_event_bytes")
    assert "the payload of event 'go' is 11 bytes" in str(error)


def test_limits_that_cannot_fit_in_a_record_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_workflow_output_bytes"):
        _ = load_settings(env={}, max_workflow_output_bytes=2_000_000).limits


def test_topics_accept_the_largest_record() -> None:
    settings = load_settings(env={}, max_record_bytes=3_000_000, max_workflow_input_bytes=2_000_000)
    wanted = str(topic_max_message_bytes(settings))
    assert {t.config["max.message.bytes"] for t in desired_topics(load_spec(), settings)} == {
        wanted
    }


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 200_000), min_size=3, max_size=3),
    tags=st.dictionaries(st.text(max_size=20), st.text(max_size=2000), max_size=30),
    limit=st.integers(40_000, 300_000),
)
def test_a_status_record_is_made_to_fit(sizes: list[int], tags: dict[str, str], limit: int) -> None:
    payloads = [Payload(b"v" * n) for n in sizes]
    status = InstanceStatus(
        "id", input=payloads[0], output=payloads[1], custom_status=payloads[2], tags=tags
    )
    assert status_size(fit_status(status, limit)) <= limit


def test_the_watchdog_stops_a_loop_that_never_yields_in_any_thread() -> None:
    watchdog = TurnWatchdog(100)
    errors: list[BaseException] = []

    def spin() -> None:
        while True:
            pass

    def in_thread() -> None:
        try:
            watchdog.run(spin, "a spinning turn")
        except WorkflowTurnTimeoutError as exc:
            errors.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    with pytest.raises(WorkflowTurnTimeoutError, match="turn budget of 100 ms"):
        watchdog.run(spin, "a spinning turn")
    assert len(errors) == 1
    watchdog.close()


def test_quick_turns_are_never_interrupted() -> None:
    watchdog = TurnWatchdog(50)
    total = sum(watchdog.run(lambda: 1, "a quick turn") for _ in range(20_000))
    assert total == 20_000 and watchdog.interrupts == 0
    watchdog.close()


def test_replay_check_reports_a_spinning_workflow_instead_of_hanging() -> None:
    from engine import Registry, WorkflowContext
    from engine.core.history import (
        ExecutionCompleted,
        ExecutionStarted,
        HistoryEvent,
        RuntimeStatus,
        TurnStarted,
    )
    from engine.services.audit.replay import ERROR, ReplayChecker

    registry = Registry()

    @registry.workflow(name="spin")
    async def spin(ctx: WorkflowContext) -> None:
        while True:
            pass

    bodies = [
        TurnStarted(1),
        ExecutionStarted("spin"),
        ExecutionCompleted(RuntimeStatus.FAILED, None, None),
    ]
    checker = ReplayChecker(registry, watchdog=TurnWatchdog(100))
    checker.feed_all(HistoryEvent("s", i, 1, 0, body) for i, body in enumerate(bodies))
    (result,) = checker.finish().results
    assert result.outcome == ERROR and "WorkflowTurnTimeoutError" in result.detail
