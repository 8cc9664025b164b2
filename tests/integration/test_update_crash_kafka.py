"""An update survives a SIGKILL of the processor between its acceptance and its completion.

The handler of ``t.slow_ledger``'s ``deposit`` waits on a durable timer, or for an
activity that takes its time on the worker, before it adds, so the update is accepted in
one turn (``UpdateAccepted`` in history) and completed in a later one. The processor is
killed once the acceptance is on the history topic and before the completion is, and
restarted with the same id and state folder: the restored instance fires the timer (or
reads the activity's result, which reached the topic while it was down), the handler
finishes, and the client that sent the update - still waiting on command-outcomes under
the update id - gets the result. History holds the acceptance and the completion once
each. Waits are bounded guards against hanging."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from engine_harness import (
    EngineProcess,
    RunningEngine,
    history_problems,
    running_engine,
    wait_until,
)

from engine.core.history import (
    RuntimeStatus,
    TaskCompleted,
    TimerFired,
    UpdateAccepted,
    UpdateCompleted,
)

pytestmark = pytest.mark.kafka

WAIT = 120.0
#: Seconds the handler sleeps: the window in which the processor is killed.
HANDLER_SLEEP = 6


def _kinds(engine: RunningEngine, instance_id: str, kind: type) -> list[Any]:
    return [e.body for e in engine.history(instance_id) if type(e.body) is kind]


@pytest.mark.parametrize("via", ["timer", "activity"])
def test_an_update_accepted_before_a_sigkill_completes_once_after_the_restart(
    kafka_bootstrap: str, tmp_path: Path, via: str
) -> None:
    with running_engine(
        kafka_bootstrap, partitions=2, in_process=False, state_dir=tmp_path
    ) as engine:
        processor = engine.processors["processor-0"]
        assert isinstance(processor, EngineProcess)
        processor.wait_for_log("restored:", WAIT)
        instance_id = f"ucrash-{uuid.uuid4().hex[:12]}"
        handle = engine.client.start("t.slow_ledger", 10, instance_id=instance_id)
        answers: list[Any] = []

        def update() -> None:
            try:
                arg = {"amount": 5, "after": HANDLER_SLEEP, "via": via}
                answers.append(handle.update("deposit", arg, update_id="dep-1", timeout=WAIT))
            except BaseException as exc:  # reported by the assertion below
                answers.append(exc)

        sender = threading.Thread(target=update, name="update")
        sender.start()
        wait_until(lambda: _kinds(engine, instance_id, UpdateAccepted), WAIT, 0.2, "the acceptance")
        processor.kill()
        # the kill came between the two turns: the completion is not on the topic
        assert not _kinds(engine, instance_id, UpdateCompleted), "completed before the kill"
        assert not answers, "answered before the kill"
        processor.start()
        sender.join(WAIT)
        assert not sender.is_alive(), f"no answer:\n{engine.logs()}"
        assert answers == [15], answers

        engine.client.raise_event(handle, "close")
        state = engine.wait_for_completion(instance_id, WAIT)
        assert state.status is RuntimeStatus.COMPLETED and state.output == 15
        assert [b.update_id for b in _kinds(engine, instance_id, UpdateAccepted)] == ["dep-1"]
        [completed] = _kinds(engine, instance_id, UpdateCompleted)
        assert completed.update_id == "dep-1"
        waited = TimerFired if via == "timer" else TaskCompleted
        assert len(_kinds(engine, instance_id, waited)) == 1
        records = engine.history_records()[instance_id]
        assert not history_problems(instance_id, records)
        assert processor.starts == 2
