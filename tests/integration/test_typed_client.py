"""Typed payloads end to end, and the client's handles: a dataclass input reaches the
workflow and its activity as a dataclass, a pydantic result comes back as a model, and
``handle.result()`` returns the workflow's annotated return type, from the sync and the
asyncio client alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from engine.client import AsyncClient, Client
from engine.core.errors import InstanceFailedError
from engine.core.history import RuntimeStatus
from tests.engine_harness import RunningEngine, running_engine
from tests.typed_workflows import Charge, Order, Receipt, Tier, checkout

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    modules = ("tests.typed_workflows", "tests.workflows_for_tests")
    with running_engine(kafka_bootstrap, partitions=2, modules=modules) as running:
        yield running


def test_a_handle_returns_the_typed_result(engine: RunningEngine) -> None:
    client: Client = engine.client
    handle = client.start(checkout, Order("o-1", 10.0, Tier.GOLD))
    receipt = handle.result(timeout=120)
    assert receipt == Receipt(Charge(charge_id="ch-o-1", amount=10.0), 9.0, "gold:o-1")
    assert handle == handle.instance_id and isinstance(handle, str)
    state = handle.status()
    assert state is not None and state.status is RuntimeStatus.COMPLETED
    assert state.output["charge"] == {"charge_id": "ch-o-1", "amount": 10.0}


def test_a_handle_by_name_gives_plain_json_unless_told(engine: RunningEngine) -> None:
    handle = engine.client.start("typed.checkout", {"id": "o-2", "amount": 4})
    assert handle.result(timeout=120)["label"] == "basic:o-2"
    again = engine.client.handle(handle, Receipt)
    assert again.result(timeout=10).charge == Charge(charge_id="ch-o-2", amount=4.0)


def test_a_failed_instance_raises_from_result(engine: RunningEngine) -> None:
    handle = engine.client.start("typed.checkout", {"id": "o-3"})  # no amount: cannot be read
    with pytest.raises(InstanceFailedError, match="FAILED") as caught:
        handle.result(timeout=120)
    assert "missing field(s) amount" in str(caught.value)


def test_the_async_client(engine: RunningEngine) -> None:
    async def main() -> list[Receipt]:
        async with AsyncClient(settings=engine.settings) as client:
            handles = [await client.start(checkout, Order(f"a-{i}", float(i))) for i in range(3)]
            return list(await asyncio.gather(*(h.result(timeout=120) for h in handles)))

    receipts = asyncio.run(main())
    assert [r.label for r in receipts] == ["basic:a-0", "basic:a-1", "basic:a-2"]
