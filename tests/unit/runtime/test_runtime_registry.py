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


async def _v1(ctx: WorkflowContext, value: int) -> int:
    return 1


async def _v2(ctx: WorkflowContext, value: int) -> int:
    return 2


async def _v10(ctx: WorkflowContext, value: int) -> int:
    return 10


def test_a_start_without_a_version_runs_the_newest() -> None:
    reg = Registry()
    reg.add_workflow(_v2, name="wf", version="2")
    reg.add_workflow(_v10, name="wf", version="10")  # numbers compare as numbers
    reg.add_workflow(_v1, name="wf", version="1")
    assert reg.get_workflow("wf", "2").fn is _v2
    assert reg.get_workflow("wf").fn is _v10
    assert reg.default_version("wf") == "10"
    assert reg.default_version("other") is None
    with pytest.raises(NotRegisteredError, match="registered versions: '1', '2', '10'"):
        reg.get_workflow("wf", "3")


def test_a_version_marked_default_wins_over_newer_ones() -> None:
    reg = Registry()
    reg.add_workflow(_v1, name="wf", version="1", default=True)
    reg.add_workflow(_v2, name="wf", version="2")  # deployed, not yet the default
    assert reg.get_workflow("wf").fn is _v1
    with pytest.raises(RegistrationError, match="both marked default=True"):
        reg.add_workflow(_v10, name="wf", version="10", default=True)
    assert reg.get_workflow("wf").fn is _v1


def test_an_unversioned_registration_is_the_oldest_but_replays_exactly() -> None:
    reg = Registry()
    reg.add_workflow(_v1, name="wf")
    assert reg.get_workflow("wf").fn is _v1
    reg.add_workflow(_v2, name="wf", version="2")
    assert reg.get_workflow("wf").fn is _v2  # new starts run version 2
    assert reg.recorded_workflow("wf", "").fn is _v1  # histories recorded with "" stay on it
    assert reg.recorded_workflow("wf", "2").fn is _v2


def test_a_history_naming_no_version_replays_with_the_default() -> None:
    reg = Registry()
    reg.add_workflow(_v1, name="wf", version="1")
    reg.add_workflow(_v2, name="wf", version="2")
    assert reg.recorded_workflow("wf", "").fn is _v2
    with pytest.raises(NotRegisteredError, match="no version '7'"):
        reg.recorded_workflow("wf", "7")


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
