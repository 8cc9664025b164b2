"""Registration of workflows and activities."""

from __future__ import annotations

import pytest

from engine import NotRegisteredError, RegistrationError, Registry, WorkflowContext
from engine.runtime import registry as registry_module


def test_decorators_register_under_function_names_and_return_the_function() -> None:
    reg = Registry()

    @reg.workflow
    async def order(ctx: WorkflowContext, value: int) -> int:
        return value

    @reg.activity
    def charge(value: int) -> int:
        return value

    assert reg.get_workflow("order").fn is order
    assert reg.get_activity("charge").fn is charge
    assert charge(3) == 3  # still a plain function
    assert reg.workflow_name(order) == "order"
    assert reg.activity_name(charge) == "charge"


def test_explicit_names_and_versions() -> None:
    reg = Registry()

    @reg.workflow(name="orders.place", version="2")
    async def place(ctx: WorkflowContext, value: int) -> int:
        return value

    @reg.activity(name="payments.charge")
    async def charge(value: int) -> int:
        return value

    assert reg.get_workflow("orders.place", "2").fn is place
    assert reg.get_workflow("orders.place").version == "2"  # the only version
    assert reg.workflow_name(place) == "orders.place"
    assert reg.activity_name(charge) == "payments.charge"
    assert reg.get_activity("payments.charge").is_async


def test_several_versions_need_an_explicit_one() -> None:
    reg = Registry()

    async def v1(ctx: WorkflowContext, value: int) -> int:
        return 1

    async def v2(ctx: WorkflowContext, value: int) -> int:
        return 2

    reg.add_workflow(v1, name="wf", version="1")
    reg.add_workflow(v2, name="wf", version="2")
    assert reg.get_workflow("wf", "2").fn is v2
    with pytest.raises(NotRegisteredError, match="registered versions: '1', '2'"):
        reg.get_workflow("wf")


def test_duplicate_names_are_rejected_with_advice() -> None:
    reg = Registry()

    @reg.workflow(name="dup")
    async def first(ctx: WorkflowContext, value: int) -> None: ...

    async def second(ctx: WorkflowContext, value: int) -> None: ...

    with pytest.raises(RegistrationError, match=r"already registered.*@workflow\(name=\.\.\.\)"):
        reg.workflow(name="dup")(second)

    @reg.activity(name="act")
    def a1() -> None: ...

    def a2() -> None: ...

    with pytest.raises(RegistrationError, match=r"@activity\(name=\.\.\.\)"):
        reg.activity(name="act")(a2)
    reg.activity(name="act")(a1)  # registering the same function again is harmless


def test_workflows_must_be_async_and_take_a_context() -> None:
    reg = Registry()

    def sync(ctx: WorkflowContext, value: int) -> int:
        return value

    async def no_args() -> None: ...

    with pytest.raises(RegistrationError, match="async def"):
        reg.add_workflow(sync)
    with pytest.raises(RegistrationError, match="accept the workflow context"):
        reg.add_workflow(no_args)


def test_workflow_without_input_parameter() -> None:
    reg = Registry()

    @reg.workflow
    async def ping(ctx: WorkflowContext) -> str:
        return "pong"

    assert reg.get_workflow("ping").takes_input is False


def test_unknown_names_say_what_is_known() -> None:
    reg = Registry()
    with pytest.raises(NotRegisteredError, match="known: none"):
        reg.get_workflow("nope")
    with pytest.raises(NotRegisteredError, match="no activity named 'nope'"):
        reg.get_activity("nope")
    assert not reg.has_workflow("nope")


def test_module_level_decorators_use_the_default_registry() -> None:
    default = registry_module.default_registry

    @registry_module.workflow(name="tests.runtime.default_registry_probe")
    async def probe(ctx: WorkflowContext, value: int) -> int:
        return value

    @registry_module.activity(name="tests.runtime.default_registry_activity")
    def probe_activity(value: int) -> int:
        return value

    assert default.get_workflow("tests.runtime.default_registry_probe").fn is probe
    assert default.get_activity("tests.runtime.default_registry_activity").fn is probe_activity
