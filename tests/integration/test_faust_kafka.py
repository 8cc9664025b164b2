"""faust-streaming interop on the real broker: a faust app, using only the codecs of
``engine.interop.faust``, starts workflows from its own business topic, raises an event on
each once its status says RUNNING, and consumes the status and command-outcome topics as
ordinary faust topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from engine_harness import RunningEngine, running_engine

from engine.core.history import RuntimeStatus
from engine.core.messages import (
    CommandOutcome,
    CommandResult,
    InstanceStatus,
    RaiseEvent,
    StartWorkflow,
)
from engine.core.payloads import Payload

faust = pytest.importorskip(
    "faust", reason="faust-streaming is not installed: pip install 'turnstile-engine[faust]'"
)
interop = pytest.importorskip("engine.interop.faust")

pytestmark = pytest.mark.kafka

ORDERS = 3
#: A bound on the whole exchange (a test that hangs must end), not a speed target.
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str, admin: Any) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running
    # faust's own topics (its assignor's leader topic) are named after the app id
    leftovers = [t for t in admin.list_topics(timeout=10).topics if t.startswith(running.namespace)]
    if leftovers:
        for future in admin.delete_topics(leftovers, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # best effort, as for the test's own topics
                future.result(timeout=30)


class Shop:
    """The faust app under test and what its agents saw."""

    def __init__(self, engine: RunningEngine, orders_topic: str) -> None:
        ns = engine.namespace
        self.app = faust.App(
            f"{ns}-shop",
            broker=f"kafka://{engine.bootstrap}",
            store="memory://",
            web_enabled=False,
            topic_partitions=2,
        )
        self.orders = self.app.topic(orders_topic, value_serializer="json")
        self.commands = interop.commands_topic(self.app, ns)
        self.statuses: dict[str, InstanceStatus] = {}
        self.outcomes: list[CommandOutcome] = []
        self.raised: set[str] = set()
        self.done = asyncio.Event()
        self._agents(ns)

    def _agents(self, ns: str) -> None:
        @self.app.agent(self.orders)
        async def start_orders(stream: Any) -> None:
            async for order in stream:
                start = StartWorkflow(
                    order["id"],
                    name="t.wait_event",
                    input=Payload(json.dumps({"event": "paid"}).encode()),
                    request_id=uuid.uuid4().hex,
                )
                await self.commands.send(key=order["id"].encode(), value=start)

        @self.app.agent(interop.status_topic(self.app, ns))
        async def watch_status(stream: Any) -> None:
            async for status in stream:
                self.statuses[status.instance_id] = status
                if status.status is RuntimeStatus.RUNNING and status.instance_id not in self.raised:
                    self.raised.add(status.instance_id)
                    paid = RaiseEvent(
                        status.instance_id,
                        name="paid",
                        input=Payload(b'{"amount": 3}'),
                        request_id=uuid.uuid4().hex,
                    )
                    await self.commands.send(key=status.instance_id.encode(), value=paid)
                completed = [s for s in self.statuses.values() if s.status.name == "COMPLETED"]
                if len(completed) == ORDERS:
                    self.done.set()

        @self.app.agent(interop.outcomes_topic(self.app, ns))
        async def watch_outcomes(stream: Any) -> None:
            async for outcome in stream:
                self.outcomes.append(outcome)

    async def run(self, order_ids: list[str]) -> None:
        await self.app.start()
        try:
            for order_id in order_ids:
                await self.orders.send(value={"id": order_id})
            await asyncio.wait_for(self.done.wait(), DEADLINE_S)
            await asyncio.sleep(0)  # let the outcome agent take what is fetched
        finally:
            await self.app.stop()


def test_a_faust_agent_starts_workflows_raises_events_and_reads_their_status(
    engine: RunningEngine, make_topic: Any
) -> None:
    order_ids = [f"faust-{uuid.uuid4().hex[:8]}" for _ in range(ORDERS)]
    shop = Shop(engine, make_topic(partitions=2, prefix="shop-orders"))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(shop.run(order_ids))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="faust-shop")
    thread.start()
    thread.join(DEADLINE_S + 60)
    assert not thread.is_alive(), "the faust app did not stop"
    assert not errors, errors

    assert shop.raised == set(order_ids)
    for order_id in order_ids:
        state = engine.wait_for_completion(order_id, 60)
        assert state.status is RuntimeStatus.COMPLETED, state.failure
        assert state.output == {"input": {"event": "paid"}, "got": {"amount": 3}}
        assert shop.statuses[order_id].status is RuntimeStatus.COMPLETED
    answered = {(o.instance_id, o.command) for o in shop.outcomes}
    for order_id in order_ids:
        assert (order_id, "StartWorkflow") in answered
    assert all(o.result is CommandResult.ACCEPTED for o in shop.outcomes)
