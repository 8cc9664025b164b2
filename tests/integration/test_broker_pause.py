"""A broker that stops answering (SIGSTOP) while a processor is inside its transactional calls.

librdkafka does not always honour the timeouts of its blocking transactional calls
(``send_offsets_to_transaction`` can block for good), and a process whose main thread is stuck
in one cannot even run its SIGTERM handler. The engine enforces deadlines itself: a processor
on a paused broker either rides it out or ends itself with a clear log line, and SIGTERM stops
it within its grace period. Nothing is lost or applied twice either way.

This test runs its own broker: pausing the shared one would stall every other test.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from engine_harness import (
    EngineProcess,
    RunningEngine,
    history_problems,
    running_engine,
    wait_until,
)

from engine.core.history import RuntimeStatus
from engine.dev.local_kafka import LocalKafka

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: A processor's deadlines: a transactional call (10 s) plus the engine's grace (5 s), then a
#: new producer's init_transactions (10 s + 5 s); the bound below only guards against a hang.
HANG = 120.0


def _load(engine: RunningEngine, base: int, expected: dict[str, int]) -> None:
    for i in range(base, base + 150):
        expected[engine.client.start("chain3.activities", i, flush=False)] = i + 3
    engine.client.flush()


def _completed(engine: RunningEngine, expected: dict[str, int]) -> int:
    done = 0
    for instance in expected:
        state = engine.client.get(instance)
        done += state is not None and state.status is RuntimeStatus.COMPLETED
    return done


def _clear_exit(proc: EngineProcess) -> None:
    """A processor that ended by itself said why, and was not SIGKILLed by the harness."""
    assert proc.returncode not in (None, -signal.SIGKILL), proc.log_tail()
    log = proc.current_log()
    reasons = ("did not return within", "could not initialise", "stopping", "error:")
    assert any(reason in log for reason in reasons), proc.log_tail()


#: What a process logs once it works again, by kind.
ACTIVE = {"processor": " restored: ", "worker": "assigned ["}


def _supervise(engine: RunningEngine) -> None:
    """Restart every engine process that ended, as a supervisor would (again, with a pause,
    while the broker is still coming back), after checking that it ended by itself with a
    reason rather than hanging."""
    kinds = [("processor", p) for p in engine.processors.values()]
    kinds += [("worker", w) for w in engine.workers.values()]
    for kind, proc in kinds:
        assert isinstance(proc, EngineProcess)
        for _ in range(10):
            if proc.alive and ACTIVE[kind] in proc.current_log():
                break
            if not proc.alive:
                _clear_exit(proc)
                time.sleep(2.0)
                proc.start()
            wait_until(
                lambda p=proc, k=kind: ACTIVE[k] in p.current_log() or not p.alive,
                HANG,
                what=f"{proc.name} to work again or exit",
            )
        assert proc.alive and ACTIVE[kind] in proc.current_log(), proc.log_tail()


def test_a_processor_on_a_paused_broker_recovers_or_exits_and_obeys_sigterm(
    tmp_path: Path,
) -> None:
    broker = LocalKafka(tmp_path / "broker")
    bootstrap = broker.start(timeout=120.0, fresh=True)
    pid = broker.status().pid
    assert pid is not None
    try:
        with running_engine(
            bootstrap, partitions=2, in_process=False, state_dir=tmp_path / "state"
        ) as engine:
            proc = engine.processors["processor-0"]
            assert isinstance(proc, EngineProcess)
            proc.wait_for_log(" restored: ")
            expected: dict[str, int] = {}

            # 1. a pause longer than every deadline: the processor rides it out or ends itself
            _load(engine, 0, expected)
            wait_until(lambda: _completed(engine, expected) >= 10, 60, what="work to flow")
            _load(engine, 1000, expected)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(30.0)
            finally:
                os.kill(pid, signal.SIGCONT)
            _supervise(engine)

            # 2. SIGTERM while the broker is paused: the processor stops within its grace
            _load(engine, 2000, expected)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(3.0)
                proc.request_stop()
                proc.wait(HANG)
                _clear_exit(proc)
            finally:
                os.kill(pid, signal.SIGCONT)
            _supervise(engine)

            for instance, output in expected.items():
                state = engine.wait_for_completion(instance, 180)
                assert (state.status, state.output) == (RuntimeStatus.COMPLETED, output), (
                    state.failure,
                    engine.logs(),
                )
            records = engine.history_records()
            problems = [p for i in expected for p in history_problems(i, records[i])]
            assert not problems, "\n".join(problems[:20])
    finally:
        os.kill(pid, signal.SIGCONT)
        broker.stop()
