"""Deadlines the engine enforces on blocking librdkafka calls (kafka_deadline), and how
TransactionalProducer reacts when a call passes its deadline (fake producers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import Any, NoReturn

import pytest
from confluent_kafka import TopicPartition
from test_kafka_io_errors import Factory, FakeProducer

from engine.adapters.kafka.deadline import (
    STUCK_EXIT_CODE,
    CallDeadlineExceeded,
    DeadlineCaller,
    close_within,
    ends_process_if_stuck,
)
from engine.adapters.kafka.io import AbortedTransaction, TransactionalProducer


class Stuck(Exception):
    """Raised by the test's on_stuck instead of ending the test process."""


def _raise_stuck(reason: str) -> NoReturn:
    raise Stuck(reason)


def test_a_call_that_returns_in_time_gives_its_result_and_its_errors() -> None:
    caller = DeadlineCaller("t", grace_s=0.0, on_stuck=_raise_stuck)
    assert caller.call("add", 1.0, lambda: 1 + 1) == 2
    with pytest.raises(ZeroDivisionError):
        caller.call("divide", 1.0, lambda: 1 / 0)
    assert caller.abandoned == 0


def test_a_call_past_its_deadline_is_abandoned_and_the_next_call_runs_elsewhere() -> None:
    release = threading.Event()
    caller = DeadlineCaller("t", grace_s=0.05, max_abandoned=5, on_stuck=_raise_stuck)
    with pytest.raises(CallDeadlineExceeded, match="send_offsets_to_transaction on t"):
        caller.call("send_offsets_to_transaction", 0.05, release.wait)
    assert caller.abandoned == 1
    # the stuck thread is still inside the first call; a new call is not queued behind it
    assert caller.call("commit_transaction", 1.0, lambda: "ok") == "ok"
    release.set()


def test_too_many_stuck_calls_end_the_process() -> None:
    release = threading.Event()
    caller = DeadlineCaller("t", grace_s=0.0, max_abandoned=1, on_stuck=_raise_stuck)
    with pytest.raises(CallDeadlineExceeded):
        caller.call("first", 0.02, release.wait)
    with pytest.raises(Stuck, match="2 such calls are stuck"):
        caller.call("second", 0.02, release.wait)
    release.set()


def test_signal_handlers_run_while_a_call_is_waited_for() -> None:
    """SIGTERM must be noticed while the main thread waits for a stuck librdkafka call."""
    seen: list[int] = []
    release = threading.Event()
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: seen.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        caller = DeadlineCaller("t", grace_s=0.0, max_abandoned=5, on_stuck=_raise_stuck)
        with pytest.raises(CallDeadlineExceeded):
            caller.call("send_offsets_to_transaction", 0.5, release.wait)
        assert seen == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()


class HangingProducer(FakeProducer):
    """A fake whose ``send_offsets_to_transaction`` blocks until released, ignoring its
    timeout, as librdkafka's does when the group coordinator stops answering."""

    release = threading.Event()
    hung = 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls.append("send_offsets")
        if HangingProducer.hung == 0:
            HangingProducer.hung += 1
            self.release.wait()


def test_a_stuck_offsets_call_recreates_the_producer_and_aborts_the_batch() -> None:
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> Any:
        made.append(HangingProducer(config))
        return made[-1]

    producer = TransactionalProducer(
        {}, "txn-1", timeout_s=0.05, producer_factory=factory, deadline_grace_s=0.05,
        on_stuck=_raise_stuck,
    )  # fmt: skip
    producer.begin()
    producer.produce("out", b"k", b"v")
    with pytest.raises(AbortedTransaction, match="did not return"):
        producer.send_offsets([TopicPartition("in", 0, 5)], object())
    assert len(made) == 2 and producer.recreated == 1
    stuck = made[0]
    assert not stuck.closed and "purge" not in stuck.calls, "a stuck producer is left alone"
    assert made[1].calls == ["init"]
    assert stuck.calls == ["init", "begin", "produce", "send_offsets"]
    assert not producer.in_transaction
    # the new producer works: the batch can be redone
    producer.begin()
    producer.produce("out", b"k", b"v")
    producer.send_offsets([TopicPartition("in", 0, 5)], object())
    producer.commit()
    HangingProducer.release.set()


def test_a_new_producer_that_cannot_initialise_ends_the_process() -> None:
    factory = Factory()
    release = threading.Event()

    class NeverInitialises(FakeProducer):
        def init_transactions(self, timeout: float) -> None:
            release.wait()

    with pytest.raises(Stuck, match="could not initialise transactions"):
        TransactionalProducer(
            {}, "txn-2", timeout_s=0.02, producer_factory=NeverInitialises,
            deadline_grace_s=0.0, on_stuck=_raise_stuck,
        )  # fmt: skip
    release.set()
    assert factory.made == []


def test_a_close_that_hangs_is_left_behind() -> None:
    release = threading.Event()
    assert close_within("closing a client", lambda: None, 1.0)
    assert not close_within("closing a client", release.wait, 0.05)
    release.set()


def test_a_shutdown_step_past_its_bound_ends_the_process() -> None:
    reasons: list[str] = []
    ended = threading.Event()

    def record(reason: str) -> None:
        reasons.append(reason)
        ended.set()

    with ends_process_if_stuck("stopping fast", 5.0, on_stuck=record):
        pass
    with ends_process_if_stuck("stopping slowly", 0.05, on_stuck=record):
        assert ended.wait(5.0)
    assert reasons == ["stopping slowly did not finish within 0s"]


STUCK_SCRIPT = """
import logging, threading
from engine.adapters.kafka.deadline import DeadlineCaller, CallDeadlineExceeded
logging.basicConfig(format="%(levelname)s %(message)s")
caller = DeadlineCaller("processor processor-0", grace_s=0.0, max_abandoned=1)
never = threading.Event()
for _ in range(2):
    try:
        caller.call("send_offsets_to_transaction", 0.05, never.wait)
    except CallDeadlineExceeded:
        pass
print("still running")
"""


def test_a_process_whose_calls_stay_stuck_ends_itself_with_status_75_naming_the_call() -> None:
    """The real watchdog (no test hook): the supervisor sees exit status 75, the log says
    which call on which client was stuck, and nothing after it runs."""
    result = subprocess.run(
        [sys.executable, "-c", STUCK_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == STUCK_EXIT_CODE == 75, result.stderr
    assert "still running" not in result.stdout
    critical = [line for line in result.stderr.splitlines() if line.startswith("CRITICAL")]
    assert len(critical) == 1, result.stderr
    assert "send_offsets_to_transaction on processor processor-0 did not return" in critical[0]
    assert "supervisor restarts it" in critical[0]
