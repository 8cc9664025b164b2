"""Sync activities on abandonable threads: a hung run times out and frees its slot."""

from __future__ import annotations

import threading

import pytest

from engine.core.errors import ActivityTimeoutError
from engine.core.messages import ActivityTask
from engine.core.payloads import Payload, describe_payload
from engine.services.worker.threads import AbandoningThreads
from engine.services.worker.timeouts import not_startable, run_timeout_s


def test_a_hung_run_is_abandoned_and_others_still_run() -> None:
    threads = AbandoningThreads("test")
    release = threading.Event()
    hung = [threads.submit(release.wait, 0.2, f"hung {i}") for i in range(3)]
    for future in hung:
        with pytest.raises(ActivityTimeoutError, match="did not finish within its timeout"):
            future.result(30)
    assert threads.abandoned == 3
    assert threads.submit(lambda: 42, 30, "healthy").result(30) == 42
    release.set()  # the abandoned runs return; their late outcomes are dropped
    threads.submit(lambda: None, 0, "sync point").result(30)
    threads.shutdown()


def test_errors_and_values_come_back_and_threads_are_reused() -> None:
    threads = AbandoningThreads("test")

    def fail() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        threads.submit(fail, 5, "failing").result(30)
    names = {
        threads.submit(lambda: threading.current_thread().name, 5, "n").result(30)
        for _ in range(20)
    }
    assert len(names) == 1  # run one after the other, they share one thread
    threads.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        threads.submit(lambda: None, 0, "late")


def _task(**kw: int) -> ActivityTask:
    return ActivityTask("i", name="a", scheduled_ms=1000, **kw)  # type: ignore[arg-type]


def test_an_attempt_past_its_deadline_is_not_started() -> None:
    late = not_startable(_task(deadline_ms=1500), 1500)
    assert late is not None and late.type == "ActivityTimeoutError" and late.retryable
    assert not_startable(_task(deadline_ms=1500), 1499) is None
    assert not_startable(_task(timeout_ms=500), 10**12) is None  # start-to-close: from start


def test_an_attempt_that_waited_past_schedule_to_start_fails_for_good() -> None:
    waited = not_startable(_task(schedule_to_start_ms=200), 1201)
    assert waited is not None and not waited.retryable and "schedule-to-start" in waited.message
    assert not_startable(_task(schedule_to_start_ms=200), 1200) is None


def test_the_run_time_is_start_to_close_cut_to_the_deadline() -> None:
    assert run_timeout_s(_task(timeout_ms=5000), 1000) == 5.0
    assert run_timeout_s(_task(timeout_ms=5000, deadline_ms=3000), 1000) == 2.0
    assert run_timeout_s(_task(deadline_ms=3000), 1000) == 2.0
    assert run_timeout_s(_task(), 1000) == 0.0
    assert run_timeout_s(_task(timeout_ms=5000, deadline_ms=900), 1000) == 0.001


def test_an_undecodable_payload_is_described_not_raised() -> None:
    shown = describe_payload(Payload(b"\xff{", "json"))
    assert shown["encoding"] == "json" and shown["size"] == 2 and shown["first_bytes"] == "ff7b"
    assert "undecodable" in describe_payload(Payload(b"x", "no-such-encoding"))
    assert describe_payload(Payload(b"[1]")) == [1]
    assert describe_payload(None) is None
