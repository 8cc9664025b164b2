"""Workflows and activities with dataclass and pydantic payloads, for the typed-payload
tests (imported by the engine under test with ``--module tests.typed_workflows``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pydantic

from engine import WorkflowContext, activity, workflow


class Tier(enum.Enum):
    GOLD = "gold"
    BASIC = "basic"


@dataclass(frozen=True)
class Order:
    id: str
    amount: float
    tier: Tier = Tier.BASIC


class Charge(pydantic.BaseModel):
    charge_id: str
    amount: float


@dataclass(frozen=True)
class Receipt:
    charge: Charge
    total: float
    label: str


@activity(name="typed.charge")
def charge(order: Order) -> Charge:
    assert isinstance(order, Order) and isinstance(order.tier, Tier)
    return Charge(charge_id=f"ch-{order.id}", amount=order.amount)


@workflow(name="typed.label")
async def label(ctx: WorkflowContext, order: Order) -> str:
    assert isinstance(order, Order)
    return f"{order.tier.value}:{order.id}"


@workflow(name="typed.checkout")
async def checkout(ctx: WorkflowContext, order: Order) -> Receipt:
    assert isinstance(order, Order), type(order)
    charged = await ctx.call_activity(charge, order)
    assert isinstance(charged, Charge), type(charged)
    text = await ctx.call_child_workflow(label, order)
    factor = 0.9 if order.tier is Tier.GOLD else 1.0
    return Receipt(charged, round(charged.amount * factor, 2), text)
