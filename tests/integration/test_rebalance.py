"""Processor replicas share the partitions: one joining and one leaving in the middle of a
run moves partitions between them, and every workflow still completes exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_harness import EngineProcess, history_problems, running_engine

from engine.core.history import ExecutionCompleted, RuntimeStatus, TaskCompleted
from engine.core.payloads import from_payload

pytestmark = pytest.mark.kafka

WORKFLOWS = 200
WAVES = 5


def test_replicas_join_and_leave_during_a_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    with running_engine(
        kafka_bootstrap, partitions=8, replicas=1, in_process=False, state_dir=tmp_path
    ) as engine:
        client = engine.client
        per_wave = WORKFLOWS // WAVES
        expected: dict[str, int] = {}

        def start_wave(wave: int) -> None:
            inputs = range(wave * per_wave, (wave + 1) * per_wave)
            for value in inputs:
                expected[client.start("chain3.activities", value, flush=False)] = value + 3
            client.flush()

        start_wave(0)
        engine.wait_for_completion(next(iter(expected)), 120)
        joined = engine.start_processor("processor-1")
        assert isinstance(joined, EngineProcess)
        start_wave(1)
        start_wave(2)
        joined.wait_for_log(" restored: ", 120)  # the newcomer owns partitions
        start_wave(3)
        left = engine.processors["processor-0"]
        assert left.stop() == 0, engine.logs()
        start_wave(4)

        for instance_id, output in expected.items():
            state = engine.wait_for_completion(instance_id, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output == output
        assert joined.alive, engine.logs()

        statuses = engine.final_statuses()
        histories = engine.history_records()
        problems = []
        for instance_id, output in expected.items():
            assert statuses[instance_id].status is RuntimeStatus.COMPLETED
            assert from_payload(statuses[instance_id].output) == output
            records = histories[instance_id]
            problems += history_problems(instance_id, records)
            events = [e for _, e in records]
            completed = [e.body for e in events if isinstance(e.body, ExecutionCompleted)]
            assert len(completed) == 1 and from_payload(completed[0].output) == output
            assert sum(isinstance(e.body, TaskCompleted) for e in events) == 3
        assert not problems, "\n".join(problems[:20])
        assert set(histories) == set(expected)
        assert not engine.dead_letters()
        # the replica that stayed took over the leaver's partitions from their changelogs
        restored = [line for line in joined.current_log().splitlines() if " restored: " in line]
        assert any(" restored: 0 " not in line for line in restored), restored
