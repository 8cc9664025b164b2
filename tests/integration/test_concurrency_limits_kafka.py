"""The per-key concurrency limit on starts on the real broker: 3*K starts of one key and
N of another; every status snapshot shows at most K running per key, the runs of one key
never overlap beyond K in their histories, and every start completes."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.core.history import (
    ExecutionCompleted,
    ExecutionStarted,
    HistoryEvent,
    RuntimeStatus,
)
from engine.core.messages import CommandResult
from tests.concurrency_workflows import LIMIT
from tests.engine_harness import running_engine, wait_until

pytestmark = pytest.mark.kafka

OTHER = 3  # starts of a second key, which has slots of its own
WORKFLOW = "cl.sync"


def test_at_most_k_instances_run_per_key(kafka_bootstrap: str) -> None:
    ids = {
        "acct-a": [f"a-{n}" for n in range(3 * LIMIT)],
        "acct-b": [f"b-{n}" for n in range(OTHER)],
    }
    with running_engine(
        kafka_bootstrap, workers=0, modules=["tests.concurrency_workflows"]
    ) as engine:
        client = engine.client
        answers = [
            client.start(WORKFLOW, key, instance_id=i, concurrency_key=key).outcome
            for key, group in ids.items()
            for i in group
        ]
        assert all(a is not None and a.result is CommandResult.BUFFERED for a in answers)
        peak: Counter[str] = Counter()
        waited = set()

        def snapshot() -> bool:
            states = {s.instance_id: s for s in client.list_instances(name=WORKFLOW)}
            for key, group in ids.items():
                running = [
                    i for i in group if i in states and states[i].status is RuntimeStatus.RUNNING
                ]
                assert len(running) <= LIMIT, (key, running)
                peak[key] = max(peak[key], len(running))
                waited.update(i for i in group if i in states and states[i].pending_reason)
            every = [i for group in ids.values() for i in group]
            return all(i in states and states[i].status is RuntimeStatus.COMPLETED for i in every)

        wait_until(snapshot, timeout=180, what="every start to complete")
        histories = engine.histories()
        runs = {i: _run_interval(histories[i]) for i in ids["acct-a"]}
    assert peak["acct-a"] >= 1 and waited  # some starts were seen waiting for a slot
    assert _most_at_once(list(runs.values())) <= LIMIT, runs


def _most_at_once(runs: list[tuple[int, int]]) -> int:
    """The most runs in progress at one time (a run that ends as another begins, in the
    same millisecond, does not overlap it)."""
    moves = sorted([(e, -1) for _, e in runs] + [(b, 1) for b, _ in runs])
    most = now = 0
    for _, step in moves:
        now += step
        most = max(most, now)
    return most


def _run_interval(history: list[HistoryEvent]) -> tuple[int, int]:
    """When the run began and ended, by the processors' clock in its history."""
    began = next(e.timestamp_ms for e in history if isinstance(e.body, ExecutionStarted))
    ended = next(e.timestamp_ms for e in history if isinstance(e.body, ExecutionCompleted))
    return began, ended
