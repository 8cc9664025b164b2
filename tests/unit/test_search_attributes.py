"""Search attributes: ctx.upsert_tags on engine.testing (recorded, replay-safe, in the
status, kept across continue-as-new, bad tags refused) and the bounds of tags."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Registry, WorkflowContext
from engine.codec import decode_message
from engine.core.errors import InvalidTagsError
from engine.core.history import ContinuedAsNew, ExecutionStarted, RuntimeStatus, TagsUpserted
from engine.core.messages import CommandOutcome, CommandResult, StartWorkflow
from engine.core.tags import MAX_KEY_CHARS, MAX_TAGS, MAX_VALUE_CHARS, checked_tags, merged_tags
from engine.runtime import WorkflowExecution
from engine.testing import TestEngine

app = Registry()


@app.workflow(name="tagged")
async def tagged(ctx: WorkflowContext, rounds: int) -> dict[str, str]:
    """Tags itself, waits, changes a tag and drops one, then continues as new ``rounds``
    times; the last run returns the tags it sees at its start."""
    if rounds == 0:
        return ctx.tags
    ctx.upsert_tags({"customer": "c-42", "stage": "new", "round": str(rounds)})
    await ctx.wait_for_event("go")
    ctx.upsert_tags({"stage": "paid", "round": ""})  # "" removes the key
    ctx.continue_as_new(rounds - 1)
    return {}


@app.workflow(name="bad_tags")
async def bad_tags(ctx: WorkflowContext, tags: Any) -> str:
    try:
        ctx.upsert_tags(tags)
    except InvalidTagsError as exc:
        return str(exc)
    return "accepted"


def test_upserted_tags_reach_the_status_history_and_the_next_run() -> None:
    with TestEngine(app) as env:
        run = env.start("tagged", 1, tags={"region": "eu"})
        env.run()
        state = env.get(run)
        assert state is not None and state.status is RuntimeStatus.RUNNING
        assert state.tags == {"region": "eu", "customer": "c-42", "stage": "new", "round": "1"}
        env.raise_event(run, "go")
        final = env.wait_for_completion(run)
        kept = {"region": "eu", "customer": "c-42", "stage": "paid"}
        assert final.output == kept  # the next run started with the merged tags
        assert final.tags == kept
        history = env.history(run)
        upserts = [e.body.tags for e in history if isinstance(e.body, TagsUpserted)]
        first = {"customer": "c-42", "stage": "new", "round": "1"}
        assert upserts == [first, {"stage": "paid", "round": ""}]
        starts = [e.body for e in history if isinstance(e.body, ExecutionStarted)]
        assert [s.tags for s in starts] == [{"region": "eu"}, kept]
        assert any(isinstance(e.body, ContinuedAsNew) for e in history)


def test_a_replay_of_the_recorded_history_takes_the_recorded_tags() -> None:
    with TestEngine(app) as env:
        run = env.start("tagged", 1)
        env.run()
        history = env.history(run)
    execution = WorkflowExecution(app, run)
    execution.replay(history)  # the code runs again; each upsert matches its record
    assert execution.tags == {"customer": "c-42", "stage": "new", "round": "1"}
    assert execution.metadata().tags == execution.tags


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({"n": 1}, "keys and values must be str"),
        ({"": "x"}, "a key is 1 to"),
        ({"a=b": "x"}, "without '='"),
        ({"k" * (MAX_KEY_CHARS + 1): "x"}, "a key is 1 to"),
        ({"k": "v" * (MAX_VALUE_CHARS + 1)}, f"at most {MAX_VALUE_CHARS}"),
        ({f"k{i}": "v" for i in range(MAX_TAGS + 1)}, f"at most {MAX_TAGS} are allowed"),
        (["not", "a", "mapping"], "must be a mapping"),
    ],
)
def test_bad_tags_raise_in_the_workflow_and_record_nothing(tags: Any, message: str) -> None:
    with TestEngine(app) as env:
        run = env.start("bad_tags", tags)
        state = env.wait_for_completion(run)
        assert message in state.output
        assert state.tags == {}
        assert not any(isinstance(e.body, TagsUpserted) for e in env.history(run))


def test_bad_start_tags_are_refused_before_anything_is_sent() -> None:
    with TestEngine(app) as env:
        with pytest.raises(InvalidTagsError, match="empty value"):
            env.start("tagged", 0, tags={"customer": ""})
        assert env.records("commands") == []


def test_merging_counts_the_tags_an_instance_ends_up_with() -> None:
    full = {f"k{i}": "v" for i in range(MAX_TAGS)}
    assert merged_tags(full, {"k0": "w"})["k0"] == "w"  # replacing keeps the count
    assert len(merged_tags(full, {"k0": "", "new": "x"})) == MAX_TAGS  # one out, one in
    with pytest.raises(InvalidTagsError, match="remove some"):
        merged_tags(full, {"new": "x"})
    assert checked_tags(None) == {}


def test_a_plain_producers_start_with_bad_tags_is_refused_and_kept() -> None:
    """A StartWorkflow written by any Kafka producer skips the client's check; the
    processor refuses it (the answer says why) and keeps the record in dead letters."""
    too_many = {f"k{i}": "v" for i in range(MAX_TAGS + 1)}
    with TestEngine(app) as env:
        env.send(StartWorkflow("plain-1", "tagged", request_id="r-1", tags=too_many))
        env.run()
        outcomes = [decode_message(r.value) for r in env.records("command-outcomes") if r.value]
        [answer] = [o for o in outcomes if isinstance(o, CommandOutcome)]
        assert answer.result is CommandResult.REFUSED
        assert answer.error == "InvalidTagsError" and "remove some" in answer.reason
        [letter] = env.dead_letters()
        assert f"at most {MAX_TAGS} are allowed" in letter.reason
        assert env.get("plain-1") is None
