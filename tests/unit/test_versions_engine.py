"""Changing code under running instances, on engine.testing: default versions (client,
plain producers, child workflows), instances that stay on their version, the per-version
counts, and the three-step patch migration with ``replay check`` on old histories."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import NonDeterminismError, Registry, WorkflowContext
from engine.cli.main import main
from engine.codec import encode_message, write_history_file
from engine.core.history import ExecutionStarted, PatchMarker, RuntimeStatus
from engine.core.messages import StartWorkflow
from engine.runtime.executor import WorkflowExecution
from engine.services.client.versions import VersionCount
from engine.testing import TestEngine


def _place(version: str) -> Callable[[WorkflowContext], Coroutine[Any, Any, str]]:
    async def place(ctx: WorkflowContext) -> str:
        await ctx.wait_for_event("go")
        return f"v{ctx.version}" if ctx.version == version else "wrong code"

    return place


def order_versions(*versions: str, default: str | None = None) -> Registry:
    """``orders.place`` in each of ``versions`` (it returns its version after an event),
    and ``orders.parent``, which runs it as a child without naming a version."""
    registry = Registry()
    for version in versions:
        registry.add_workflow(
            _place(version), name="orders.place", version=version, default=version == default
        )

    @registry.workflow(name="orders.parent")
    async def parent(ctx: WorkflowContext) -> str:
        child = ctx.call_child_workflow("orders.place", instance_id=f"{ctx.instance_id}-child")
        result: str = await child
        return result

    return registry


def started_version(env: TestEngine, instance_id: str) -> str:
    starts = [e.body for e in env.history(instance_id) if isinstance(e.body, ExecutionStarted)]
    assert len(starts) == 1
    return starts[0].version


def test_a_start_without_a_version_runs_the_default_and_records_it() -> None:
    with TestEngine(order_versions("1", "2")) as env:
        run = env.start("orders.place")  # two versions registered: not an error any more
        env.raise_event(run, "go")
        assert env.wait_for_completion(run).output == "v2"
        assert started_version(env, run) == "2"
        state = env.get(run)
        assert state is not None and state.version == "2"
        old = env.start("orders.place", version="1")  # a version named is a version run
        env.raise_event(old, "go")
        assert env.wait_for_completion(old).output == "v1"


def test_a_version_marked_default_runs_for_plain_producers_and_children() -> None:
    with TestEngine(order_versions("1", "2", default="1")) as env:
        command = StartWorkflow(instance_id="plain-1", name="orders.place")  # version ""
        env.produce(env.topics.commands, b"plain-1", encode_message(command))
        parent = env.start("orders.parent", instance_id="p")
        env.run()
        env.raise_event("plain-1", "go")
        env.raise_event("p-child", "go")
        assert env.wait_for_completion("plain-1").output == "v1"
        assert env.wait_for_completion(parent).output == "v1"
        assert started_version(env, "p-child") == "1"


def test_running_instances_stay_on_their_version_after_a_new_default() -> None:
    with TestEngine(order_versions("1")) as env:
        old = env.start("orders.place")
        env.run()
        env.deploy(order_versions("1", "2"))  # version 2 is the default from now on
        new = env.start("orders.place")
        env.run()
        assert env.client.versions() == [
            VersionCount("orders.place", "1", open=1, ended=0),
            VersionCount("orders.place", "2", open=1, ended=0),
        ]
        listed = env.client.list_instances(version="1")
        assert [s.instance_id for s in listed] == [old]
        for run in (old, new):
            env.raise_event(run, "go")
        assert env.wait_for_completion(old).output == "v1"
        assert env.wait_for_completion(new).output == "v2"
        counts = env.client.versions("orders.place")
        assert [(c.version, c.open, c.ended) for c in counts] == [("1", 0, 1), ("2", 0, 1)]


def test_a_scheduled_start_counts_under_the_version_it_would_run() -> None:
    with TestEngine(order_versions("1", "2")) as env:
        run = env.start("orders.place", start_at=env.now() + timedelta(hours=1))
        env.run()
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.PENDING
        assert state.version == "2"
        assert env.client.versions() == [VersionCount("orders.place", "2", open=1, ended=0)]
        env.advance(timedelta(hours=1))
        env.raise_event(run, "go")
        assert env.wait_for_completion(run).output == "v2"


# --- patching -------------------------------------------------------------------------------

STEPS = ("old", "patched", "deprecated", "removed")


def shipping(step: str) -> Registry:
    """One workflow through the migration of docs/how-to/change-code.md: post, then courier."""
    registry = Registry()

    @registry.activity(name="ship.post")
    def post(order: str) -> str:
        return f"{order} by post"

    @registry.activity(name="ship.courier")
    def courier(order: str) -> str:
        return f"{order} by courier"

    async def ship(ctx: WorkflowContext, order: str) -> str:
        if step == "old":
            courier_now = False
        elif step == "patched":
            courier_now = ctx.patched("courier")
        else:
            if step == "deprecated":
                ctx.deprecate_patch("courier")
            courier_now = True
        receipt: str = await ctx.call_activity(
            "ship.courier" if courier_now else "ship.post", order
        )
        await ctx.wait_for_event("delivered")
        return receipt

    registry.add_workflow(ship, name="ship")
    return registry


def test_the_three_step_migration_keeps_every_instance_on_its_path() -> None:
    """Each step starts an instance and lets the previous step's instance finish."""
    with TestEngine(shipping("old")) as env:
        runs: dict[str, str] = {}
        for step in STEPS:
            env.deploy(shipping(step))
            runs[step] = env.start("ship", step, instance_id=f"order-{step}")
            env.run()
            index = STEPS.index(step)
            if index:
                previous = runs[STEPS[index - 1]]
                env.raise_event(previous, "delivered")
                env.run()
        env.raise_event(runs["removed"], "delivered")
        env.run()
        outputs = {step: env.get(run).output for step, run in runs.items()}  # type: ignore[union-attr]
        assert outputs == {
            "old": "old by post",
            "patched": "patched by courier",
            "deprecated": "deprecated by courier",
            "removed": "removed by courier",
        }
        marks = {
            step: [e.body for e in env.history(run) if isinstance(e.body, PatchMarker)]
            for step, run in runs.items()
        }
        assert marks == {
            "old": [],
            "patched": [PatchMarker("courier")],
            "deprecated": [PatchMarker("courier", deprecated=True)],
            "removed": [],
        }
        # the last step could not replay the patched run: that is why step 2 waits for it
        with pytest.raises(NonDeterminismError, match=re.escape("ctx.patched('courier')")):
            WorkflowExecution(shipping("removed"), runs["patched"]).replay(
                env.history(runs["patched"])
            )


CODE = """
from engine import WorkflowContext
from engine.runtime.registry import Registry

registry = Registry()


@registry.workflow(name="ship")
async def ship(ctx: WorkflowContext, order: str) -> str:
    {body}
    receipt: str = await ctx.call_activity(activity, order)
    await ctx.wait_for_event("delivered")
    return receipt
"""

PATCHED = CODE.format(body='activity = "ship.courier" if ctx.patched("courier") else "ship.post"')
REMOVED = CODE.format(body='activity = "ship.courier"')


def test_replay_check_verifies_old_and_patched_histories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestEngine(shipping("old")) as env:
        before = env.start("ship", "a", instance_id="before-patch")
        env.run()
        env.deploy(shipping("patched"))
        after = env.start("ship", "b", instance_id="after-patch")
        env.run()
        env.raise_event(before, "delivered")
        env.run()
        histories = env.history(before) + env.history(after)
    path = tmp_path / "histories.avro"
    with path.open("wb") as fo:
        write_history_file(fo, histories)
    (tmp_path / "patched_ship.py").write_text(PATCHED)
    (tmp_path / "removed_ship.py").write_text(REMOVED)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["replay", "check", "--from-file", str(path), "--registry"]
    assert main([*argv, "patched_ship:registry"]) == 0
    out = capsys.readouterr().out
    assert "replayed 2 instances" in out and "all decisions match" in out
    assert main([*argv, "removed_ship:registry"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGED before-patch" in out  # the old path is gone from that code
    assert "DIVERGED after-patch" in out and "PatchMarker(patch_id='courier')" in out


def test_the_docs_patching_example_runs() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "change-code.md"
    code = re.search(r"```python\n(.*?)```", page.read_text(), re.S)
    assert code is not None, "docs/how-to/change-code.md lost its example"
    exec(compile(code.group(1), "change-code.md", "exec"), {"__name__": "docs_changing_code"})
