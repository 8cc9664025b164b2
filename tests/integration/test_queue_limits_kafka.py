"""A task queue's fleet-wide rate limit on the real broker: two workers share the queue and
together never start more than N activities per second.

Only the limit is asserted (no 10 s window ever holds more than the rate allows, plus the
one-second burst the token buckets keep), never a throughput floor: a loaded machine may run
slower than the limit, and that is not a failure of the limit."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

from engine.adapters.kafka.admin import ensure_task_queue_topics
from engine.adapters.kafka.config import producer_config
from engine.adapters.kafka.worker import KafkaWorker
from engine.codec import encode_message
from engine.core.messages import ActivityTask
from engine.core.payloads import to_payload
from engine.runtime.registry import Registry
from engine.services.worker.queue_limits import QueueLimits
from tests.engine_harness import ThreadProcess, running_engine, wait_until

pytestmark = pytest.mark.kafka

RATE = 20.0
WINDOW_S = 10.0
starts: list[float] = []
ran: set[int] = set()
lock = threading.Lock()
registry = Registry()


@registry.activity(name="rated.tick", task_queue="rated")
def tick(n: int) -> int:
    with lock:
        starts.append(time.monotonic())
        ran.add(n)
    return n


def test_a_queue_rate_limit_holds_across_two_workers(kafka_bootstrap: str) -> None:
    with running_engine(kafka_bootstrap, workers=0, replicas=0, modules=[]) as engine:
        ensure_task_queue_topics(engine.settings, ["rated"])
        producer = Producer(producer_config(kafka_bootstrap))
        topic = engine.topics.task_queue("rated")
        total = int(RATE * WINDOW_S * 1.6)
        for n in range(total):
            task = ActivityTask(f"i-{n}", 0, 0, 1, "rated.tick", to_payload(n), task_queue="rated")
            producer.produce(topic, encode_message(task), task.instance_id.encode())
        assert producer.flush(30) == 0
        workers = []
        for name in ("w1", "w2"):
            worker = KafkaWorker(
                engine.settings,
                registry,
                worker_id=name,
                task_queue="rated",
                queue_limits=QueueLimits(rate=RATE),
                shutdown_timeout_s=5,
            )
            engine.workers[name] = ThreadProcess(name, worker.run).start()
            workers.append(worker)
        wait_until(lambda: len(ran) == total, timeout=180, what=f"all {total} tasks to run")
    busiest = max(sum(1 for t in starts if first <= t < first + WINDOW_S) for first in starts)
    # within 10 % of the rate over 10 s: RATE * WINDOW_S, plus the buckets' one-second burst
    assert busiest <= RATE * (WINDOW_S + 1), busiest
    assert all(w.worker.stats["failures"] == 0 for w in workers)
    # both workers took part, so the limit held across the fleet and not on one worker alone
    assert all(w.worker.stats["tasks"] > 0 for w in workers), [w.worker.stats for w in workers]
