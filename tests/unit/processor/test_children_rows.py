"""Running children live in rows of their own (``processor.children``), not in a list in
the parent's row: the parent's row stays the same size however many children it waits
for, and rows written when the list was in the row keep working."""

from __future__ import annotations

from typing import Any

from engine import Registry, WorkflowContext
from engine.core.history import RuntimeStatus
from engine.core.instance_row import RunningChild
from engine.services.processor import keys
from engine.services.processor.children import running
from engine.services.processor.meta import encode_meta
from engine.testing import TestEngine

registry = Registry()


@registry.workflow(name="kid")
async def kid(ctx: WorkflowContext, _: Any) -> str:
    return str(await ctx.wait_for_event("go"))


@registry.workflow(name="many")
async def many(ctx: WorkflowContext, n: int) -> int:
    kids = [
        ctx.call_child_workflow(kid, None, instance_id=f"{ctx.instance_id}-{i}") for i in range(n)
    ]
    return len(await ctx.when_all(kids))


def _row_bytes(env: TestEngine, instance_id: str) -> int:
    pp = env.processors[env.partition_of(instance_id)]
    meta = pp.tables.load_meta(instance_id)
    assert meta is not None
    return len(encode_meta(meta))


def test_the_parents_row_does_not_grow_with_its_children() -> None:
    sizes = {}
    for n in (1, 300):
        with TestEngine(registry) as env:
            env.start("many", n, instance_id="p")
            env.run()
            pp = env.processors[0]
            meta = pp.tables.load_meta("p")
            assert meta is not None and meta.children == []
            assert len(running(pp.tables, meta)) == n
            sizes[n] = _row_bytes(env, "p")
    # a few bytes for the longer input and the larger sequence numbers; the list of 300
    # children in the row was over 3,000
    assert sizes[300] - sizes[1] < 16


def test_a_childs_result_removes_its_row_and_the_parent_goes_on() -> None:
    with TestEngine(registry) as env:
        env.start("many", 2, instance_id="p")
        env.run()
        env.raise_event("p-0", "go", 1)
        env.run()
        pp = env.processors[0]
        meta = pp.tables.load_meta("p")
        assert meta is not None
        assert [c.instance_id for c in running(pp.tables, meta)] == ["p-1"]
        env.raise_event("p-1", "go", 2)
        assert env.wait_for_completion("p").output == 2
        assert running(pp.tables, pp.tables.load_meta("p")) == []  # type: ignore[arg-type]


def _as_old_row(env: TestEngine, instance_id: str) -> None:
    """Rewrite the parent's stored state as the engine wrote it before the children table:
    every running child listed in the row itself, no child rows."""
    pp = env.processors[env.partition_of(instance_id)]
    meta = pp.tables.load_meta(instance_id)
    assert meta is not None
    listed = running(pp.tables, meta)
    changes: dict[bytes, bytes | None] = {
        keys.child_key(instance_id, c.instance_id): None for c in listed
    }
    meta.children = [
        RunningChild(c.instance_id, c.generation, c.parent_close_policy) for c in listed
    ]
    changes[keys.meta_key(instance_id)] = encode_meta(meta)
    pp.tables.store.write(changes)
    pp.cache.clear()


def test_an_old_row_listing_its_children_still_works() -> None:
    with TestEngine(registry) as env:
        env.start("many", 2, instance_id="p")
        env.run()
        _as_old_row(env, "p")
        env.raise_event("p-0", "go", 1)
        env.run()
        pp = env.processors[0]
        meta = pp.tables.load_meta("p")
        assert meta is not None and [c.instance_id for c in meta.children] == ["p-1"]
        env.terminate("p", "stop all", recursive=True)  # reaches the child the row lists
        env.run()
        state = env.get("p-1")
        assert state is not None and state.status is RuntimeStatus.TERMINATED


def test_a_purge_removes_the_rows_of_children_still_listed() -> None:
    abandon = Registry()
    abandon.add_workflow(kid, name="kid")

    @abandon.workflow(name="leaves")
    async def leaves(ctx: WorkflowContext, _: Any) -> None:
        from engine.core.history import ParentClosePolicy

        child = ctx.call_child_workflow(
            kid, None, instance_id="left", parent_close_policy=ParentClosePolicy.ABANDON
        )
        await ctx.sleep(1)
        del child

    with TestEngine(abandon) as env:
        env.start("leaves", None, instance_id="p")
        env.wait_for_completion("p")
        pp = env.processors[0]
        prefix = keys.child_prefix("p")
        assert list(pp.tables.store.scan(prefix, prefix + b"\xff"))  # still listed
        env.purge("p")
        env.run()
        assert list(pp.tables.store.scan(prefix, prefix + b"\xff")) == []
