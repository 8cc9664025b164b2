"""engine.testing: triggers run in the test engine. A record produced on a trigger topic
becomes the trigger bridge's command (same mapping, same request id), once; a record the
mapping refuses becomes a dead letter with the reason; what workflows publish can be read
back, and can feed another trigger."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_message
from engine.config.settings import Settings
from engine.config.triggers import Trigger
from engine.core.errors import TriggerError
from engine.core.messages import RaiseEvent, StartWorkflow
from engine.core.payloads import from_payload
from engine.testing import TestEngine

app = Registry()


@app.workflow(name="ship")
async def ship(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    paid = await ctx.wait_for_event("paid", timeout=timedelta(days=1))
    shipment = {"order": ctx.instance_id, "paid": paid["amount"]}
    await ctx.publish("shipments", shipment, headers={"customer": order["customer"]})
    return f"shipped {order['parcels']} for {paid['amount']}"


@app.workflow(name="notify")
async def notify(ctx: WorkflowContext, shipment: dict[str, Any]) -> str:
    return f"told the customer of {shipment['order']}"


TRIGGERS = (
    Trigger("orders", "ship"),
    Trigger("payments", "ship", action="raise", event="paid", id="field:order_id"),
    Trigger("shipments", "notify", id="header:customer"),
)


def _engine() -> TestEngine:
    return TestEngine(app, settings=Settings(triggers=TRIGGERS, publish_topics=("shipments",)))


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_records_on_trigger_topics_start_workflows_and_raise_events() -> None:
    with _engine() as env:
        order = env.produce("orders", b"o-1", _json({"parcels": 2, "customer": "c-1"}))
        env.run()
        assert env.get("o-1").status.value == "RUNNING"  # type: ignore[union-attr]
        env.produce("payments", b"any key", _json({"order_id": "o-1", "amount": 30}))
        state = env.wait_for_completion("o-1")
        assert state.output == "shipped 2 for 30"
        env.run()  # the bridge read every record already: nothing is routed twice
        commands = [decode_message(r.value or b"") for r in env.records("commands")]
        start, paid, shipped = commands  # the last from the record ship published
        assert isinstance(start, StartWorkflow) and isinstance(paid, RaiseEvent)
        assert isinstance(shipped, StartWorkflow) and shipped.instance_id == "c-1"
        assert start.request_id == f"trigger:orders:{order.partition}:{order.offset}"
        assert (start.instance_id, start.name) == ("o-1", "ship")
        assert from_payload(start.input) == {"parcels": 2, "customer": "c-1"}
        assert (paid.instance_id, paid.name) == ("o-1", "paid")
        assert env.dead_letters() == []


def test_records_the_mapping_refuses_become_dead_letters_with_the_reason() -> None:
    with _engine() as env:
        env.produce("orders", None, _json({"parcels": 1}))
        env.produce("payments", b"o-2", b"not json")
        env.produce("payments", b"o-2", _json({"amount": 5}))
        env.run()
        letters = sorted((d.source_topic, d.reason) for d in env.dead_letters())
        assert env.records("commands") == []
    assert [topic for topic, _ in letters] == ["orders", "payments", "payments"]
    reasons = " | ".join(reason for _, reason in letters)
    assert "trigger orders -> start ship (id from key): the record has no key" in reasons
    assert "the value is not JSON" in reasons
    assert "the value has no field 'order_id'" in reasons


def test_a_record_a_workflow_publishes_can_be_read_and_can_trigger_another_workflow() -> None:
    with _engine() as env:
        env.produce("orders", b"o-3", _json({"parcels": 1, "customer": "c-9"}))
        env.produce("payments", None, _json({"order_id": "o-3", "amount": 9}))
        env.wait_for_completion("o-3")
        [published] = env.records("shipments")
        assert json.loads(published.value or b"") == {"order": "o-3", "paid": 9}
        assert published.headers == (("customer", b"c-9"),)
        assert env.wait_for_completion("c-9").output == "told the customer of o-3"


def test_a_trigger_for_a_workflow_that_is_not_registered_is_refused() -> None:
    settings = Settings(triggers=(Trigger("orders", "no-such-workflow"),))
    with pytest.raises(TriggerError, match="not registered"):
        TestEngine(app, settings=settings)
