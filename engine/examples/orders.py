"""An order process: charge the card, wait for a person's approval (with a deadline), ship
through a child workflow, and refund the charge if anything after it fails.

The refund sits in ``finally``-style compensation, so it also runs when the approval times
out or the shipment fails: the saga pattern in plain Python.
"""

from __future__ import annotations

from typing import Any

from engine import (
    ActivityFailedError,
    ChildWorkflowFailedError,
    RetryPolicy,
    WorkflowContext,
    WorkflowTimeoutError,
    activity,
    workflow,
)

QUICK_RETRY = RetryPolicy(max_attempts=3, initial_interval=0.2, backoff_coefficient=2.0)


@activity(name="orders.charge")
def charge(order: dict[str, Any]) -> dict[str, Any]:
    """Take the payment (here: compute a charge record; a real one would call a PSP)."""
    if order["amount"] <= 0:
        from engine import ApplicationError

        raise ApplicationError("amount must be positive", type="InvalidAmount", non_retryable=True)
    return {"charge_id": f"ch-{order['order_id']}", "amount": order["amount"]}


@activity(name="orders.refund")
def refund(charge_record: dict[str, Any]) -> dict[str, Any]:
    return {"refunded": charge_record["charge_id"]}


@activity(name="orders.pack")
def pack(order: dict[str, Any]) -> str:
    return f"parcel-{order['order_id']}"


@activity(name="orders.dispatch")
def dispatch(parcel: str) -> str:
    return f"tracking-{parcel}"


@workflow(name="orders.ship")
async def ship(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    """Child workflow: pack, then hand to the carrier."""
    parcel = await ctx.call_activity(pack, order, retry=QUICK_RETRY)
    tracking = await ctx.call_activity(dispatch, parcel, retry=QUICK_RETRY)
    return {"parcel": parcel, "tracking": tracking}


@workflow(name="orders.order")
async def order(ctx: WorkflowContext, order: dict[str, Any]) -> dict[str, Any]:
    ctx.set_custom_status("charging")
    charged = await ctx.call_activity(charge, order, retry=QUICK_RETRY)
    try:
        ctx.set_custom_status("awaiting approval")
        timeout = float(order.get("approval_timeout_s", 60))
        approval = await ctx.wait_for_event("approval", timeout=timeout)
        if not approval or not approval.get("approved"):
            raise OrderRejected("the order was not approved")
        ctx.set_custom_status("shipping")
        shipment = await ctx.call_child_workflow(ship, order, instance_id=f"{ctx.instance_id}:ship")
    except (
        OrderRejected,
        WorkflowTimeoutError,
        ChildWorkflowFailedError,
        ActivityFailedError,
    ) as exc:
        ctx.set_custom_status("refunding")
        refunded = await ctx.call_activity(refund, charged, retry=QUICK_RETRY)
        return {"status": "refunded", "reason": str(exc), **refunded}
    ctx.set_custom_status("done")
    return {"status": "shipped", "charge": charged, **shipment}


class OrderRejected(Exception):
    """The approver said no."""
