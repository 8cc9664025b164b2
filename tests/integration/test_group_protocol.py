"""Under the consumer group protocol (KIP-848, ``group_protocol = "consumer"``) a replica
joining or leaving moves only the partitions that change owner: a replica never gives back a
partition it keeps (under ``classic`` every rebalance revokes all of them and each replica
takes its share back), and every workflow still completes exactly once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from engine_harness import EngineProcess, history_problems, running_engine

from engine.core.history import ExecutionCompleted, RuntimeStatus
from engine.core.payloads import from_payload

pytestmark = pytest.mark.kafka

PER_WAVE = 40
_MOVE = re.compile(r"partitions \[([\d, ]*)\] (restored|revoked)")


def moves(log: str) -> list[tuple[str, set[int]]]:
    """The replica's rebalance steps, in order: ("restored" | "revoked", partitions)."""
    return [
        (m.group(2), {int(p) for p in m.group(1).split(",") if p.strip()})
        for m in _MOVE.finditer(log)
    ]


def given_back(steps: list[tuple[str, set[int]]]) -> list[set[int]]:
    """The revocations that took every partition the replica held: what each eager
    rebalance does, also to the partitions the replica keeps and restores again."""
    held: set[int] = set()
    whole = []
    for kind, parts in steps:
        if kind == "restored":
            held |= parts
            continue
        if parts == held:
            whole.append(parts)
        held -= parts
    return whole


def test_the_log_check_tells_eager_rebalances_apart() -> None:
    eager = moves(
        "partitions [0, 1, 2, 3] restored: 9 changelog records\n"
        "partitions [0, 1, 2, 3] revoked\npartitions [0, 1] restored: 4 changelog records\n"
    )
    incremental = moves(
        "partitions [0, 1, 2, 3] restored: 9 changelog records\npartitions [2, 3] revoked\n"
        "partitions [1] revoked\npartitions [2] restored: 1 changelog records\n"
    )
    assert given_back(eager) == [{0, 1, 2, 3}]
    assert given_back(incremental) == []


def test_joining_and_leaving_replicas_stop_nothing_else(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNSTILE_GROUP_PROTOCOL", "consumer")
    with running_engine(
        kafka_bootstrap,
        partitions=6,
        replicas=1,
        in_process=False,
        state_dir=tmp_path,
        settings_changes={"group_protocol": "consumer"},
    ) as engine:
        client = engine.client
        expected: dict[str, int] = {}

        def wave(start: int) -> None:
            for value in range(start, start + PER_WAVE):
                expected[client.start("chain3.activities", value, flush=False)] = value + 3
            client.flush()

        first = engine.processors["processor-0"]
        assert isinstance(first, EngineProcess)
        wave(0)
        first.wait_for_log("consumer group protocol", 60)
        engine.wait_for_completion(next(iter(expected)), 120)
        second = engine.start_processor("processor-1")
        assert isinstance(second, EngineProcess)
        wave(100)
        second.wait_for_log(" restored: ", 120)
        first.wait_for_log(" revoked", 120)  # it gave the newcomer its share
        third = engine.start_processor("processor-2")
        assert isinstance(third, EngineProcess)
        wave(200)
        third.wait_for_log(" restored: ", 120)
        assert second.stop() == 0, engine.logs()  # leaves the group: its partitions move
        wave(300)

        for instance_id, output in expected.items():
            state = engine.wait_for_completion(instance_id, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output == output
        statuses = engine.final_statuses()
        histories = engine.history_records()
        problems = []
        for instance_id, output in expected.items():
            assert from_payload(statuses[instance_id].output) == output
            problems += history_problems(instance_id, histories[instance_id])
            done = [e for _, e in histories[instance_id] if isinstance(e.body, ExecutionCompleted)]
            assert len(done) == 1
        assert not problems, "\n".join(problems[:20])
        assert not engine.dead_letters()
        for replica in (first, third):
            steps = moves(replica.current_log())
            assert steps, replica.current_log()
            assert given_back(steps) == [], steps
