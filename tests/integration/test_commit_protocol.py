"""The Kafka loop runs each batch as the numbered commit protocol and reports every step,
with its duration and count, to the metrics hook it was given."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from engine_harness import ThreadProcess, running_engine

from engine.adapters.kafka.processor import ProcessorRunner
from engine.core.history import RuntimeStatus
from engine.runtime.registry import default_registry
from engine.services.processor.protocol import Step, SystemClock

pytestmark = pytest.mark.kafka

COMMITTED_BATCH = [
    Step.ACCEPT,
    Step.TIMERS,
    Step.STEP,
    Step.PRODUCE,
    Step.OFFSETS,
    Step.COMMIT,
    Step.APPLY,
]


class Recorder:
    """A metrics hook that keeps every observation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[Step, float, int]] = []

    def observe(self, step: Step, seconds: float, count: int) -> None:
        with self.lock:
            self.seen.append((step, seconds, count))

    def steps(self) -> list[tuple[Step, float, int]]:
        with self.lock:
            return list(self.seen)


def contains_in_order(steps: list[Step], wanted: list[Step]) -> bool:
    it = iter(steps)
    return all(step in it for step in wanted)


def test_every_batch_step_reaches_the_metrics_hook(kafka_bootstrap: str, tmp_path: Path) -> None:
    with running_engine(
        kafka_bootstrap, partitions=2, replicas=0, workers=0, state_dir=tmp_path
    ) as engine:
        settings = replace(engine.settings, replica_id="processor-0", state_dir=str(tmp_path))
        recorder = Recorder()
        runner = ProcessorRunner(settings, default_registry, clock=SystemClock(), metrics=recorder)
        handle = ThreadProcess("processor-0", runner.run).start()
        try:
            echo = engine.client.start("t.echo", "hello")
            timed = engine.client.start("t.timer_inline", {"sleep": 0.2, "x": 21})
            assert engine.wait_for_completion(echo, 60).output == "hello"
            state = engine.wait_for_completion(timed, 60)
            assert (state.status, state.output) == (RuntimeStatus.COMPLETED, 42)
        finally:
            handle.stop()
        assert handle.error is None, handle.error
    seen = recorder.steps()
    assert contains_in_order([s for s, _, _ in seen], COMMITTED_BATCH)
    assert all(seconds >= 0 and count >= 0 for _, seconds, count in seen)
    assert sum(c for s, _, c in seen if s is Step.ACCEPT) >= 2, "both starts were accepted"
    assert sum(c for s, _, c in seen if s is Step.TIMERS) >= 1, "the timer fired"
    assert sum(c for s, _, c in seen if s is Step.COMMIT) == runner.progress.transactions
