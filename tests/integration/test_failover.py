"""Failover on the real broker: a SIGKILLed replica is noticed by its peer through the
liveness topic and evicted from the group, the peer fences its transactional id and takes its
partitions over, and every workflow completes once.

Nothing here asserts how fast: the eviction and the fencing are read from the survivor's log
(the group's 10 s session timeout would otherwise remove the dead member first, and no
eviction would be logged). benchmarks/failover.py measures the time."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_harness import EngineProcess, history_problems, running_engine, wait_until

from engine.cli.main import main
from engine.core.history import EventRaised, RuntimeStatus

pytestmark = pytest.mark.kafka

PARTITIONS = 4
WAITING = 24


def test_a_killed_replica_is_evicted_and_fenced_by_its_peer(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=PARTITIONS, replicas=2, in_process=False, state_dir=tmp_path
    ) as engine:
        client = engine.client
        survivor, victim = engine.processors["processor-0"], engine.processors["processor-1"]
        assert isinstance(survivor, EngineProcess) and isinstance(victim, EngineProcess)
        victim.wait_for_log(" restored: ", 120)
        waiting = [client.start("t.wait_event", {"n": i}, flush=False) for i in range(WAITING)]
        client.flush()
        for instance in waiting:
            wait_until(
                lambda i=instance: (
                    (s := client.get(i)) is not None and s.status is RuntimeStatus.RUNNING
                ),
                60,
                what=f"{instance} to run",
            )
        victim.kill()
        for i, instance in enumerate(waiting):
            client.raise_event(instance, "go", i, wait=False)
        client.flush()
        for i, instance in enumerate(waiting):
            state = engine.wait_for_completion(instance, 120)
            assert state.status is RuntimeStatus.COMPLETED, (state.failure, engine.logs())
            assert state.output["got"] == i

        log = survivor.current_log()
        assert "replica processor-1 silent for " in log, log[-3000:]
        assert f"fenced {engine.namespace}.processor.processor-1" in log, log[-3000:]
        records = engine.history_records()
        problems = [
            p for instance in waiting for p in history_problems(instance, records[instance])
        ]
        assert not problems, "\n".join(problems[:20])
        for instance in waiting:
            raised = [e for _, e in records[instance] if isinstance(e.body, EventRaised)]
            assert len(raised) == 1, f"{instance}: the event was applied {len(raised)} times"
        assert survivor.stop() == 0
        cli = ["--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace, "--quiet"]
        assert main(["history", "verify", "--all", *cli]) == 0
