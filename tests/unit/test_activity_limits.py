"""Per-activity concurrency limits on one worker: a limited activity waits for its own
slots while tasks of other activities behind it go first."""

from __future__ import annotations

import threading
import time

import pytest

from engine.codec import decode_message, encode_message
from engine.core.errors import RegistrationError
from engine.core.messages import ActivityResult, ActivityTask
from engine.core.payloads import to_payload
from engine.runtime.registry import Registry
from engine.services.worker.worker import Outbound, TaskRecord, Worker

running = 0
peak = 0
release = threading.Event()
lock = threading.Lock()
registry = Registry()


@registry.activity(name="gpu", max_concurrency=2)
def gpu(x: int) -> int:
    global running, peak
    with lock:
        running += 1
        peak = max(peak, running)
    release.wait(30)
    with lock:
        running -= 1
    return x


@registry.activity(name="fast")
def fast(x: int) -> int:
    return x + 100


def _record(task: ActivityTask, offset: int) -> TaskRecord:
    return TaskRecord(0, offset, b"i", encode_message(task), 0)


def _collect(worker: Worker, count: int) -> list[ActivityResult]:
    out: list[Outbound] = []
    deadline = time.monotonic() + 30
    while len(out) < count and time.monotonic() < deadline:
        out.extend(worker.collect(0.02))
    results = [decode_message(o.value) for o in out]
    return [r for r in results if isinstance(r, ActivityResult)]


def test_a_limited_activity_never_exceeds_its_slots_and_others_pass_it() -> None:
    worker = Worker(registry, source_topic="t.activity-tasks", concurrency=8)
    worker.assigned([0])
    tasks = [ActivityTask("i", 0, n, 1, "gpu", to_payload(n)) for n in range(5)]
    tasks.append(ActivityTask("i", 0, 9, 1, "fast", to_payload(1)))
    worker.accept([_record(t, n) for n, t in enumerate(tasks)])
    assert worker.running == 3 and worker.queued == 3  # two gpu slots, and the fast task
    [first] = _collect(worker, 1)
    assert first.task_id == 9  # the fast task went past the waiting gpu tasks
    release.set()
    results = _collect(worker, 5)
    assert sorted(r.task_id for r in results) == [0, 1, 2, 3, 4]
    assert peak == 2
    worker.shutdown()


def test_a_bad_limit_is_refused_at_registration() -> None:
    with pytest.raises(RegistrationError, match="max_concurrency"):
        Registry().add_activity(fast, name="f", max_concurrency=-1)
