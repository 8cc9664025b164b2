"""Static group membership on the real broker: a crashed replica (or worker) restarted under
the same replica id (worker id) takes its old place in the group, and a replica that stops
cleanly still hands its partitions over at once.

Both tests give the processors a 60 s session timeout, far longer than either test needs: a
dynamic member's partitions would stay with the dead (or departed static) member until that
session expired, so finding them owned and worked on by then shows the mechanism, without
asserting how fast anything is (speed lives in benchmarks/restart.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from engine_harness import EngineProcess, RunningEngine, running_engine, wait_until

from engine.core.history import RuntimeStatus

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SESSION_MS = 60_000
MODULES = ("engine.examples.chain3",)


@pytest.fixture
def long_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine processes started by the harness read TURNSTILE_* from the environment."""
    monkeypatch.setenv("TURNSTILE_EXTRA_KAFKA", f"session.timeout.ms={SESSION_MS}")


def _members(
    engine: RunningEngine, group: str | None = None, topic: str | None = None
) -> list[tuple[str | None, set[int]]]:
    """(group.instance.id, partitions of ``topic``) of each member of ``group`` (by default
    the processors' group and the commands topic)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": engine.bootstrap})
    group = group or engine.settings.processor_group
    topic = topic or engine.topics.commands
    info: Any = admin.describe_consumer_groups([group])[group].result(timeout=30)
    members = []
    for member in info.members:
        owned = member.assignment.topic_partitions if member.assignment else []
        partitions = {tp.partition for tp in owned if tp.topic == topic}
        members.append((member.group_instance_id, partitions))
    return sorted(members, key=lambda m: str(m[0]))


def _run_on_every_partition(
    engine: RunningEngine, base: int, workflow: str = "chain3.inline"
) -> None:
    """Enough workflows that every partition gets some; each must complete with x + 3."""
    ids = {engine.client.start(workflow, base + i): base + i + 3 for i in range(24)}
    for instance, expected in ids.items():
        state = engine.wait_for_completion(instance, SESSION_MS / 1000 - 15)
        assert (state.status, state.output) == (RuntimeStatus.COMPLETED, expected), engine.logs()


def test_a_crashed_replica_restarts_into_its_own_place_in_the_group(
    kafka_bootstrap: str, tmp_path: Path, long_session: None
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=4, modules=MODULES, workers=0, in_process=False,
        state_dir=tmp_path,
    ) as engine:  # fmt: skip
        proc = engine.processors["processor-0"]
        assert isinstance(proc, EngineProcess)
        proc.wait_for_log(" restored: ")
        _run_on_every_partition(engine, 0)
        assert _members(engine) == [("processor-0", {0, 1, 2, 3})]

        proc.kill()  # no clean-up: the group still counts the dead member
        killed = time.monotonic()
        proc.start()
        proc.wait_for_log(" restored: ", SESSION_MS / 1000 - 15)
        _run_on_every_partition(engine, 100)
        # still one member, under the same instance id; the dead one's session never expired
        assert time.monotonic() - killed < SESSION_MS / 1000
        assert _members(engine) == [("processor-0", {0, 1, 2, 3})]


def test_a_replica_that_stops_cleanly_hands_its_partitions_over_at_once(
    kafka_bootstrap: str, tmp_path: Path, long_session: None
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=4, modules=MODULES, replicas=2, workers=0,
        in_process=False, state_dir=tmp_path,
    ) as engine:  # fmt: skip
        first, second = engine.processors["processor-0"], engine.processors["processor-1"]
        assert isinstance(first, EngineProcess) and isinstance(second, EngineProcess)
        wait_until(lambda: [len(p) for _, p in _members(engine)] == [2, 2], 120, what="two members")
        _run_on_every_partition(engine, 0)

        stopped = time.monotonic()
        assert second.stop() == 0
        assert "did not take the partitions back" not in second.current_log()
        _run_on_every_partition(engine, 100)
        assert time.monotonic() - stopped < SESSION_MS / 1000
        assert _members(engine) == [("processor-0", {0, 1, 2, 3})]


def test_a_crashed_worker_restarts_into_its_own_place_in_the_group(
    kafka_bootstrap: str, tmp_path: Path, long_session: None
) -> None:
    from engine.adapters.kafka.worker import worker_member_id

    with running_engine(
        kafka_bootstrap, partitions=2, modules=MODULES, in_process=False, state_dir=tmp_path
    ) as engine:
        worker = engine.workers["worker-0"]
        assert isinstance(worker, EngineProcess)
        member = worker_member_id(engine.namespace, "worker-0")
        group, tasks = engine.settings.worker_group, engine.topics.activity_tasks
        _run_on_every_partition(engine, 0, "chain3.activities")
        assert _members(engine, group, tasks) == [(member, {0, 1})]

        worker.kill()  # no clean-up: the group still counts the dead member
        killed = time.monotonic()
        worker.start()
        _run_on_every_partition(engine, 100, "chain3.activities")
        assert time.monotonic() - killed < SESSION_MS / 1000
        assert _members(engine, group, tasks) == [(member, {0, 1})]
